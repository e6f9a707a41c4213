//! Shared harness for the integration tests: a throwaway `redis-server` per test (plain,
//! or also serving TLS), a TCP proxy that can cut or stall the network between a client
//! and Redis, a throwaway CA for the TLS tests, a runner for the `posgate` binary, a
//! client for the push API, a recording relay on the pod network (`peer_tap`), and the
//! rule for test tools that may be missing (`tools`).
//!
//! Declare it as `pub mod support;` in a test file: public items of a public module are
//! not dead code, so each test file may use just the parts it needs.
//!
//! What it does not do: install Redis or the test tools (`scripts/test` does) or reach
//! anything but 127.0.0.1.

pub mod binary;
pub mod peer_tap;
pub mod push;
pub mod redis_server;
pub mod tcp_proxy;
pub mod tls;
pub mod tools;

pub use redis_server::RedisServer;
pub use tcp_proxy::TcpProxy;
