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

/// Rings the doorbells of `owners` that are on this host, from one socket.
/// Nobody there is no error, and a doorbell whose queue is full (its waiter
/// stopped with SIGSTOP, say) has rung already: the ringer goes on to the next
/// at once rather than wait for that waiter to drain it.
pub fn ring(owners: &[String]) {
    let Ok(socket) = UnixDatagram::unbound() else {
        return;
    };
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    for owner in owners {
        if let Ok(address) = address(owner) {
            let _ = socket.send_to_addr(&[1], &address);
        }
    }
}

fn address(owner: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("lockrun/{owner}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    fn token(what: &str) -> String {
        format!("doorbell-test-{what}-{}", std::process::id())
    }

    #[test]
    fn one_ring_reaches_every_doorbell_past_one_that_is_not_there() {
        let owners = [token("first"), token("absent"), token("third")];
        let first = Doorbell::new(&owners[0]).unwrap();
        let third = Doorbell::new(&owners[2]).unwrap();
        ring(&owners);
        assert!(first.wait(Duration::ZERO).unwrap());
        assert!(third.wait(Duration::ZERO).unwrap());
    }

    /// A waiter that does not drain its doorbell (a lockrun stopped with
    /// SIGSTOP) fills its queue; whoever rings it then goes on.
    #[test]
    fn ringing_a_full_doorbell_does_not_block_the_ringer() {
        let owner = token("full");
        let doorbell = Doorbell::new(&owner).unwrap();
        let (done, rung) = mpsc::channel();
        let ringer = owner.clone();
        thread::spawn(move || {
            for _ in 0..1000 {
                ring(std::slice::from_ref(&ringer));
            }
            done.send(()).unwrap();
        });
        assert!(
            rung.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the ringer blocked on a full doorbell"
        );
        assert!(doorbell.wait(Duration::ZERO).unwrap());
    }
}
