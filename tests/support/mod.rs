//! The one harness of the integration tests (every file of `tests/` is a module of the
//! `it` binary, see `tests/it.rs`):
//!
//! - `redis_server`: a throwaway `redis-server` per test (plain, or also serving TLS);
//!   [`RedisProxy`] (the load harness's) cuts a client off from it, `stall_proxy`
//!   freezes its connections half-open;
//! - `pod`: in-process pods with fast timings; `cluster`: several of them over one Redis
//!   with an overlap sampler; `farm`: a farm of simulated terminals with its CA file and
//!   directory import;
//! - `gateway`: in-process pods with terminals and the push API, each behind its own
//!   `RedisProxy`, and the load harness's open-loop pushes through them;
//! - `binary`: the `posgate` binary, one command or a `posgate serve` process;
//! - `api`: a pod's HTTP API (pushes, GETs, `/metrics`); `router`: the HTTP router alone
//!   on a socket, and raw HTTP/1.1 exchanges with it; `peer_tap`: a recording relay on
//!   the pod network;
//! - `wait`: polling for a condition; `tls`: a throwaway CA; `tools`: the rule for test
//!   tools that may be missing.
//!
//! What it does not do: install Redis or the test tools (`scripts/test` does) or reach
//! anything but 127.0.0.1.

pub mod api;
pub mod binary;
pub mod clock_shift;
pub mod cluster;
pub mod farm;
pub mod gateway;
pub mod leases;
pub mod peer_tap;
pub mod pod;
pub mod redis_ha;
pub mod redis_server;
pub mod router;
pub mod stall_proxy;
pub mod tls;
pub mod tools;
pub mod wait;

/// The TCP proxy between a client and Redis that cuts it off (`cut`, `restore`); the
/// load harness uses the same one.
pub use posgate_loadtest::load::proxy::RedisProxy;
pub use redis_server::RedisServer;

/// Sends the pods' `tracing` output to the test's captured output, so a failing test
/// prints what its pods logged (a passing one prints nothing). `POSGATE_TEST_LOG` sets
/// the filter (`EnvFilter` syntax, `off` for none); the default is `posgate=info`, the
/// reconciler's decisions and the connection layer's closes. Idempotent: the first call
/// installs the one global subscriber.
pub fn capture_logs() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("POSGATE_TEST_LOG")
        .unwrap_or_else(|_| EnvFilter::new("posgate=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}
