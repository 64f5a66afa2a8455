//! Peers that misbehave on purpose, on loopback only.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A loopback listener that accepts connections and never says a word: a TLS peer that
/// stalls, the way a wedged apid or a black-holing load balancer does. It also counts the
/// connections it accepted, so that a test can tell that nothing was dialled.
pub struct BlackHole {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl BlackHole {
    /// Starts one on a free loopback port.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (count, keep) = (Arc::clone(&accepted), Arc::clone(&held));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                keep.lock().unwrap().push(stream);
            }
        });
        Self { addr, accepted, held }
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// How many connections it accepted.
    #[must_use]
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.held.lock().unwrap().clear();
    }
}

/// A loopback port with nothing listening on it (bound, read, released): connecting to it
/// is refused.
///
/// # Panics
/// When no loopback port can be bound.
#[must_use]
pub fn refused_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").to_string()
}
