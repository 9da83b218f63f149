//! TLS for PostgreSQL with rustls and ring, the TLS lockrun has for
//! `rediss://`, after libpq's `sslmode`:
//!
//! - `disable`: never TLS.
//! - `prefer` (the default): TLS when the server offers it, plain when it does
//!   not; the certificate is not checked, so this guards against eavesdropping,
//!   not impersonation. Unlike libpq, a failed TLS handshake is not retried
//!   without TLS, and rustls speaks TLS 1.2 and 1.3 only: a server offering
//!   just older versions fails rather than falling back to plain text.
//! - `require`: TLS, the certificate unchecked, except that with a root
//!   certificate file (`sslrootcert`, or `~/.postgresql/root.crt`) it is
//!   checked as with `verify-ca`, as in libpq.
//! - `verify-ca`: the certificate must chain to a trusted root.
//! - `verify-full`: and be for the host name (or IP address) connected to.
//!
//! Trusted roots are `sslrootcert` (a PEM file, or `system` for the system's
//! trust store), else `~/.postgresql/root.crt`, else the system's trust store
//! (where libpq would fail for want of `root.crt`). TLS is never used on a
//! Unix socket, as in libpq.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, ring};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::target::{Roots, SslMode, Target};
use crate::backend::net::{Failure, Kind};

/// The TLS connector for `target`'s sslmode and roots.
pub(super) fn connector(target: &Target) -> Result<MakeRustlsConnect, Failure> {
    let tls = &target.tls;
    let provider = Arc::new(ring::default_provider());
    let refused =
        |why: String| Failure::new(Kind::Permanent, format!("PostgreSQL at {target}: {why}"));
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|err| refused(format!("TLS: {err}")))?;
    let check = match (tls.mode, &tls.roots) {
        (SslMode::Disable | SslMode::Prefer, _)
        | (SslMode::Require, None | Some(Roots::System)) => Check::Nothing,
        (SslMode::Require | SslMode::VerifyCa, _) => Check::Chain,
        (SslMode::VerifyFull, _) => Check::ChainAndName,
    };
    let config = if check == Check::Nothing {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier {
                chain: None,
                provider,
            }))
            .with_no_client_auth()
    } else {
        let roots = Arc::new(load_roots(tls.roots.as_ref()).map_err(refused)?);
        let chain = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|err| refused(format!("TLS: {err}")))?;
        if check == Check::ChainAndName {
            builder.with_webpki_verifier(chain).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier {
                    chain: Some(chain),
                    provider,
                }))
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

fn load_roots(roots: Option<&Roots>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Some(Roots::File(path)) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|err| format!("cannot read sslrootcert {}: {err}", path.display()))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "sslrootcert {} holds no certificate",
                    path.display()
                ));
            }
        }
        Some(Roots::System) | None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "no trusted root certificates found on this system; set sslrootcert".into(),
                );
            }
        }
    }
    Ok(store)
}

/// A verifier for `require`/`prefer` (no `chain`: any certificate) and
/// `verify-ca` (the chain, not the name). The handshake's signatures are
/// always checked, so the server must hold the certificate's key.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            result => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
