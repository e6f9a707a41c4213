//! Redis high availability (issue 16) against real `redis-server` and `redis-sentinel`
//! processes (`support::redis_ha`: a master, two replicas, three sentinels on loopback):
//!
//! - `cli`: `posgate terminals` commands through a `redis+sentinel://` URL reach the
//!   promoted master after a failover, unchanged;
//! - `store`: the store behind a `redis+sentinel://` URL follows a planned failover
//!   (`SENTINEL FAILOVER`) and a killed master, its event subscription too; a direct
//!   `redis://` endpoint whose node becomes a replica (a managed Redis's DNS-switched
//!   primary) reconnects instead of failing `READONLY` call after call;
//! - `pods`: three pods over a few hundred simulated terminals under open-loop pushes with
//!   same-key retries, through (a) a planned failover, (b) `kill -9` of the master, (c) a
//!   failover that loses lease writes (replication cut just before a pod joins, then the
//!   master killed), (d) a promoted replica whose clock is behind, (e) a failover that
//!   loses every registration (replication cut for a member TTL); each: pushes 200,
//!   no terminal disconnected, no session overlap, no key twice, no epoch a terminal
//!   refused, the same owners afterwards, and the time until ownership can change again;
//! - `isolation`: a master cut off with one pod (`min-replicas-to-write`) refuses its
//!   writes, so that pod gives its shards up before the others take them;
//! - `disagreeing`: of two sentinels naming two masters, the store follows the one with
//!   the higher config epoch.

mod cli;
mod disagreeing;
mod isolation;
mod pods;
mod store;
