//! A doorbell that another lockrun on this host can ring: an abstract unix
//! datagram socket named after its owner's token. Ringing it wakes exactly that
//! waiter, whatever else happens to the store. Abstract names belong to a
//! network namespace and vanish with their socket, so nothing is left behind;
//! anyone can ring, which at worst makes a waiter look at its line once more.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub struct Doorbell {
    socket: UnixDatagram,
}

impl Doorbell {
    /// The doorbell of `owner` (a token: unique, so no two waiters share one).
    pub fn new(owner: &str) -> io::Result<Self> {
        let socket = UnixDatagram::bind_addr(&address(owner)?)?;
        Ok(Self { socket })
    }

    /// Waits up to `timeout` for a ring; true when it rang (every ring so far is taken).
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        // A zero timeout would mean "forever" to the socket.
        self.socket
            .set_read_timeout(Some(timeout.max(Duration::from_micros(1))))?;
        let mut byte = [0u8; 1];
        match self.socket.recv(&mut byte) {
            Ok(_) => {}
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false);
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => return Ok(false),
            Err(err) => return Err(err),
        }
        self.socket.set_nonblocking(true)?;
        while self.socket.recv(&mut byte).is_ok() {}
        self.socket.set_nonblocking(false)?;
        Ok(true)
    }
}

/// Rings `owner`'s doorbell, if there is one on this host; nobody there is no error.
pub fn ring(owner: &str) {
    let Ok(address) = address(owner) else { return };
    if let Ok(socket) = UnixDatagram::unbound() {
        let _ = socket.send_to_addr(&[1], &address);
    }
}

fn address(owner: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("lockrun/{owner}"))
}
