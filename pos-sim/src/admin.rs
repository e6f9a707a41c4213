//! The farm's admin endpoint: plain HTTP/1 JSON for load tests and operators.
//!
//! `GET /counters`, `GET /terminals/{id}`, `GET /refusals` (stale-epoch refusals with pod
//! and time), `GET /duplicates` (keys accepted again, with the pods of both copies),
//! `GET /dark?since=<unix_ms>` (dark intervals that ended since then, summarised),
//! `GET /faults`, `POST /faults` (a whole
//! [`FaultConfig`]), `POST /drop` (a [`DropRequest`]). It is for loopback use: no TLS, no
//! authentication, and it never talks to terminals' clients.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde::{de::DeserializeOwned, Serialize};
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::{debug, info, warn};

use super::{DropRequest, FaultConfig, Shared, SimError};

/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

/// A running admin endpoint; dropping it stops accepting.
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    pub(crate) async fn start(shared: Arc<Shared>, addr: SocketAddr) -> Result<Self, SimError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| SimError::Bind { addr, source })?;
        info!(%addr, "admin endpoint listening");
        let task = tokio::spawn(accept_loop(shared, listener));
        Ok(AdminServer { addr, task })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&shared, req).await) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await
            {
                debug!(%error, "admin connection ended with an error");
            }
        });
    }
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_else(|e| e.to_string().into_bytes());
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message.into() }))
}

async fn read_json<T: DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Response<Full<Bytes>>> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))
}

/// The `since` of `GET /dark?since=<unix_ms>`: 0 (everything kept) when absent; `Err`
/// for anything but one unsigned integer.
fn since_param(query: Option<&str>) -> Result<u64, String> {
    let mut since = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "since" {
            return Err(format!("unknown parameter {name:?}; only since=<unix_ms>"));
        }
        if since.is_some() {
            return Err("since given twice".into());
        }
        let ms = value
            .parse::<u64>()
            .map_err(|_| format!("since={value:?} is not a unix time in ms"))?;
        since = Some(ms);
    }
    Ok(since.unwrap_or(0))
}

async fn route(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/counters") => json(StatusCode::OK, &shared.counters()),
        (&Method::GET, "/dark") => match since_param(req.uri().query()) {
            Ok(since) => json(StatusCode::OK, &shared.dark_intervals(since)),
            Err(why) => error(StatusCode::BAD_REQUEST, why),
        },
        (&Method::GET, "/refusals") => json(StatusCode::OK, &shared.refusals.refusals()),
        (&Method::GET, "/duplicates") => json(StatusCode::OK, &shared.duplicates.duplicates()),
        (&Method::GET, "/faults") => json(StatusCode::OK, &*shared.faults()),
        (&Method::POST, "/faults") => match read_json::<FaultConfig>(req).await {
            Ok(faults) => match shared.set_faults(faults) {
                Ok(dropped) => json(StatusCode::OK, &serde_json::json!({ "dropped": dropped })),
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
            },
            Err(resp) => resp,
        },
        (&Method::POST, "/drop") => match read_json::<DropRequest>(req).await {
            Ok(drop) => match shared.drop_connections(drop.fraction) {
                Ok(dropped) => json(StatusCode::OK, &serde_json::json!({ "dropped": dropped })),
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
            },
            Err(resp) => resp,
        },
        (&Method::GET, p) if p.starts_with("/terminals/") => {
            match shared.report(&p["/terminals/".len()..]) {
                Some(report) => json(StatusCode::OK, &report),
                None => error(StatusCode::NOT_FOUND, "no such terminal in this farm"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

#[cfg(test)]
mod tests {
    use super::since_param;

    #[test]
    fn since_is_one_unsigned_integer_or_absent() {
        assert_eq!(since_param(None), Ok(0));
        assert_eq!(since_param(Some("")), Ok(0));
        assert_eq!(
            since_param(Some("since=1700000000123")),
            Ok(1_700_000_000_123)
        );
        for bad in [
            "since=-1",
            "since=",
            "since=1&since=2",
            "from=1",
            "since=1.5",
        ] {
            assert!(since_param(Some(bad)).is_err(), "{bad}");
        }
    }
}
