//! `StallProxy`: a loopback TCP relay whose live connections can be frozen half-open
//! ([`StallProxy::stall`]): they stay open but nothing is forwarded any more (the proxy's
//! kernel still ACKs, so TCP keepalive cannot notice), while new connections are relayed
//! normally. Only a client that replaces its connection recovers.
//!
//! Not for: a partition (connections closed, new ones blackholed): that is
//! [`super::RedisProxy`], the load harness's proxy, whose `cut` and `restore` the tests
//! use as they are. It has no stall, and this relay exists only for that.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// See the module docs. Dropping it closes every connection.
pub struct StallProxy {
    addr: SocketAddr,
    stall: watch::Sender<()>,
    frozen: Arc<Mutex<Vec<TcpStream>>>,
    accept: JoinHandle<()>,
}

impl StallProxy {
    /// Listens on `127.0.0.1:0` and relays every connection to `target`.
    pub async fn start(target: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (stall, mut orders) = watch::channel(());
        let frozen = Arc::new(Mutex::new(Vec::new()));
        let kept = frozen.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                // Every stall so far marked seen: only a later one freezes this connection.
                orders.borrow_and_update();
                tokio::spawn(relay(client, target, orders.clone(), kept.clone()));
            }
        });
        StallProxy {
            addr,
            stall,
            frozen,
            accept,
        }
    }

    /// The port it listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://<proxy addr>/`.
    pub fn redis_url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Freezes every live connection; new ones are relayed.
    pub fn stall(&self) {
        self.stall.send_replace(());
    }
}

/// Relays until the proxy says stall (then keeps both ends open, unread) or is dropped
/// (then closes them).
async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    mut stall: watch::Receiver<()>,
    frozen: Arc<Mutex<Vec<TcpStream>>>,
) {
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return;
    };
    let stalled = tokio::select! {
        order = stall.changed() => order.is_ok(),
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => false,
    };
    if stalled {
        frozen.lock().unwrap().extend([client, upstream]);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.frozen.lock().unwrap().clear();
    }
}
