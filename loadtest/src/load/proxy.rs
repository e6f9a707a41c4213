//! A loopback TCP proxy between one pod and Redis that can cut the pod off: `cut` closes
//! the live connections and holds new ones open without forwarding (a dead network path:
//! the client sees timeouts, not refusals); `restore` forwards again and drops what it held.
//! `retarget` sends new connections elsewhere while the live ones stay where they were,
//! as a DNS name switched to another node looks to a client that keeps its connection.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::oneshot,
    task::JoinHandle,
};

use super::LoadError;

struct State {
    target: SocketAddr,
    cut: bool,
    live: Vec<oneshot::Sender<()>>,
    held: Vec<TcpStream>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// See the module docs; dropping it closes everything.
pub struct RedisProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

async fn forward(mut client: TcpStream, state: Arc<Mutex<State>>) {
    let (tx, rx) = oneshot::channel();
    let target = {
        let mut s = lock(&state);
        if s.cut {
            s.held.push(client);
            return;
        }
        s.live.push(tx);
        s.target
    };
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    tokio::select! {
        _ = rx => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
    }
}

impl RedisProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Result<Self, LoadError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| LoadError::io("binding a redis proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| LoadError::io("redis proxy address", e))?;
        let state = Arc::new(Mutex::new(State {
            target,
            cut: false,
            live: Vec::new(),
            held: Vec::new(),
        }));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, shared.clone()));
            }
        });
        Ok(RedisProxy {
            addr,
            state,
            accept,
        })
    }

    /// `redis://<proxy>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Cut the pod off: close live connections, hold new ones unforwarded.
    pub fn cut(&self) {
        let live = {
            let mut s = lock(&self.state);
            s.cut = true;
            std::mem::take(&mut s.live)
        };
        for tx in live {
            let _ = tx.send(());
        }
    }

    /// New connections go to `target` from now on; live ones stay where they are.
    pub fn retarget(&self, target: SocketAddr) {
        lock(&self.state).target = target;
    }

    /// Forward again; connections held while cut are closed.
    pub fn restore(&self) {
        let mut s = lock(&self.state);
        s.cut = false;
        s.held.clear();
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
        lock(&self.state).held.clear();
    }
}
