//! Servers that accept and then do not answer in time: one that stays silent,
//! one that trickles a byte a second. Each serves every connection in a thread
//! of its own and stops when dropped.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

#[derive(Clone)]
pub enum Manner {
    /// Reads nothing and sends nothing.
    Silent,
    /// Sends these bytes, then one filler byte a second, for ever: an answer
    /// that never ends but always seems to be on its way.
    Trickle { first: Vec<u8>, filler: u8 },
}

pub struct SlowServer {
    address: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl SlowServer {
    pub fn start(manner: Manner) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a slow server");
        listener.set_nonblocking(true).expect("nonblocking accept");
        let address = listener.local_addr().expect("its address");
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopped);
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((socket, _)) => {
                        let (manner, stop) = (manner.clone(), Arc::clone(&stop));
                        thread::spawn(move || serve(socket, &manner, &stop));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Self { address, stopped }
    }

    /// A server that trickles an answer starting with `first`, as Redis's "+" or HTTP's "HTTP/1.1".
    pub fn trickle(first: &[u8], filler: u8) -> Self {
        Self::start(Manner::Trickle {
            first: first.to_vec(),
            filler,
        })
    }

    /// A server that trickles a TLS record header announcing a long
    /// handshake record, then its body: a TLS client waits in its handshake.
    pub fn trickle_tls() -> Self {
        Self::trickle(&[0x16, 0x03, 0x03, 0x3f, 0xff, 0x02], 0)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for SlowServer {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

fn serve(mut socket: TcpStream, manner: &Manner, stopped: &AtomicBool) {
    let mut sent = false;
    while !stopped.load(Ordering::Relaxed) {
        if let Manner::Trickle { first, filler } = manner {
            let bytes = if sent {
                std::slice::from_ref(filler)
            } else {
                first.as_slice()
            };
            if socket.write_all(bytes).is_err() {
                return;
            }
            sent = true;
        }
        thread::sleep(Duration::from_secs(1));
    }
}
