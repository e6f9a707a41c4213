//! `TcpProxy`: a loopback TCP forwarder whose network can be broken on purpose.
//!
//! - [`TcpProxy::cut`]: a partition. Live connections are closed; new ones are accepted
//!   but never forwarded (held open, unread), so clients see timeouts rather than
//!   refusals, as behind a dead network path.
//! - [`TcpProxy::stall`]: half-open connections. Live connections stay open but stop
//!   forwarding forever (the proxy's kernel still ACKs, so TCP keepalive cannot notice);
//!   new connections work normally. Only a client that replaces its connection recovers.
//! - [`TcpProxy::restore`]: forward new connections again and close everything held.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What a forwarding connection is told to do.
enum Order {
    Close,
    Hold,
}

#[derive(Default)]
struct State {
    cut: bool,
    /// One per live forwarding connection.
    live: Vec<oneshot::Sender<Order>>,
    /// Connections kept open without forwarding (blackholed or stalled).
    held: Vec<TcpStream>,
}

/// See the module docs. Dropping it closes every connection.
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

async fn forward(mut client: TcpStream, target: SocketAddr, state: Arc<Mutex<State>>) {
    let (tx, rx) = oneshot::channel();
    {
        // Decide under the lock, so a `cut` cannot slip between the check and the
        // registration.
        let mut s = lock(&state);
        if s.cut {
            s.held.push(client);
            return;
        }
        s.live.push(tx);
    }
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return;
    };
    let order = tokio::select! {
        biased;
        order = rx => order.unwrap_or(Order::Close),
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => return,
    };
    if let Order::Hold = order {
        let mut s = lock(&state);
        s.held.push(client);
        s.held.push(upstream);
    }
}

impl TcpProxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, target, shared.clone()));
            }
        });
        TcpProxy {
            addr,
            state,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<proxy addr>/`, with `userinfo` (e.g. `user:pass@`) if not empty.
    pub fn redis_url(&self, userinfo: &str) -> String {
        format!("redis://{userinfo}{}/", self.addr)
    }

    fn order_all(&self, order: impl Fn() -> Order) {
        let live = std::mem::take(&mut lock(&self.state).live);
        for tx in live {
            let _ = tx.send(order());
        }
    }

    /// Partition: close live connections, blackhole new ones.
    pub fn cut(&self) {
        lock(&self.state).cut = true;
        self.order_all(|| Order::Close);
    }

    /// Half-open: live connections stop forwarding but stay open; new ones work.
    pub fn stall(&self) {
        self.order_all(|| Order::Hold);
    }

    /// Heal: forward new connections again and close everything held.
    pub fn restore(&self) {
        let mut s = lock(&self.state);
        s.cut = false;
        s.held.clear();
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.order_all(|| Order::Close);
        lock(&self.state).held.clear();
    }
}
