//! The terminal directory: which terminals exist, where to reach them, and which TLS
//! name to verify — shared by all pods, partitioned by shard.
//!
//! A terminal belongs to shard [`shard_of`](crate::core::shard::shard_of)`(id, shards)`. Each shard's terminals are
//! kept apart (in Redis one hash per shard, see `store::keys`), with a per-shard change
//! counter, so the owner of a shard reads only its own terminals and notices changes by
//! polling the counters ([`Directory::versions`]) instead of re-reading everything.
//!
//! - [`Directory`]: what a shard owner needs (read one shard, poll versions, write its
//!   shard back after the store lost it: [`restore`]).
//! - [`DirectoryAdmin`]: the writes (`posgate terminals ...`): upsert, remove, replace
//!   all (a per-shard diff, so only shards that really change get a new version), count.
//! - Implementations: `RedisStore` (`store/redis/directory.rs`) and
//!   [`MemoryDirectory`] (embedded mode, tests).
//! - [`Terminal::new`] validates a terminal; [`csv`] parses and validates an import file.
//!
//! Versions: a shard's version changes on every write that changes the shard and never
//! goes back, even when the store lost its data: a write sets it to
//! `max(previous + 1, store clock in ms)` (the epoch rule of `docs/design.md`). A reader
//! must read `versions` *before* `terminals`, so a change racing with the read shows up
//! as a new version on the next poll. Versions come with the store generation they were
//! read in ([`Versions`]): a version goes back to 0 only when the store lost its data,
//! and the generation tells a copy read before the loss from one read after it.
//!
//! What it does not do: dial terminals, or make a multi-chunk write atomic. Writes go in
//! chunks of [`WRITE_CHUNK`] terminals; each chunk is atomic, a failed write may have
//! applied some chunks (repeating it is safe: every write is idempotent).

mod admin;
pub mod csv;
mod memory;
pub mod restore;

use crate::api::{valid_terminal_id, Labels};
use std::fmt;
use std::future::Future;
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

use crate::core::lease::Checked;
use crate::core::ShardId;
use crate::store::StoreError;

pub use self::admin::{
    by_shard, diff_shard, edits, ids_by_shard, DirectoryAdmin, DirectoryEdits, Grouped, ShardDiff,
    WriteSummary,
};
pub use self::memory::MemoryDirectory;
pub use self::restore::{Refusal, Restore, Restored};

/// Terminals (or ids) per write call: one Redis script call each.
pub const WRITE_CHUNK: usize = 1_000;

/// One terminal as listed in the directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    /// `[A-Za-z0-9._:-]{1,64}`.
    pub id: String,
    /// `host:port` to dial.
    pub addr: String,
    /// The TLS server name to send (SNI) and verify.
    pub server_name: String,
    /// What broadcasts select it by; none by default.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// What the connection manager needs. Implemented for Redis and memory.
pub trait Directory: Send + Sync + 'static {
    /// Every terminal of `shard`, sorted by id.
    fn terminals(
        &self,
        shard: ShardId,
    ) -> impl Future<Output = Result<Vec<Terminal>, StoreError>> + Send;

    /// A change counter per shard (index = position in `shards`): it differs from an
    /// earlier answer whenever the shard's terminals changed since; 0 for a shard never
    /// written (or lost with the store's data). Read in one atomic step with the store
    /// generation.
    fn versions(
        &self,
        shards: &[ShardId],
    ) -> impl Future<Output = Result<Versions, StoreError>> + Send;

    /// Writes `request.terminals` back as the shard's directory if the store lost it and
    /// the caller holds the shard: the checks are in [`restore`]. Writes the whole shard
    /// or nothing, in one atomic step.
    fn restore(
        &self,
        request: &Restore<'_>,
    ) -> impl Future<Output = Result<Checked<Restored>, StoreError>> + Send;
}

/// The answer of [`Directory::versions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The store generation the versions were read in; `None` while the store has none
    /// (Redis restarted empty and no pod has written since).
    pub generation: Option<String>,
    /// One per shard asked for, in the same order.
    pub versions: Vec<u64>,
}

/// Bytes of a bad value an error shows, at most (escapes included).
pub const SHOWN_BYTES: usize = 100;

/// A value from the input, as an error shows it: quoted and escaped like `{:?}`, cut
/// (between characters) so the escaped text is at most [`SHOWN_BYTES`], with its whole
/// length named, so that a huge field (a 1 MB cell of an import file) or one of
/// control bytes (each escaped to six) names what is wrong without flooding the
/// terminal or the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    /// The escaped start of the value, without quotes.
    start: String,
    /// Whether `start` is all of it.
    whole: bool,
    len: usize,
}

impl Shown {
    pub fn new(value: &str) -> Shown {
        let mut start = String::new();
        let mut whole = true;
        for c in value.chars() {
            let escaped = c.escape_debug();
            if start.len() + escaped.len() > SHOWN_BYTES {
                whole = false;
                break;
            }
            start.extend(escaped);
        }
        Shown {
            start,
            whole,
            len: value.len(),
        }
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.start)?;
        if !self.whole {
            write!(f, "... ({} bytes in all)", self.len)?;
        }
        Ok(())
    }
}

/// Why a terminal cannot be listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTerminal {
    #[error("invalid id {0}: must be 1-64 characters of [A-Za-z0-9._:-]")]
    Id(Shown),
    #[error("invalid addr {addr}: {reason}")]
    Addr { addr: Shown, reason: &'static str },
    #[error("invalid server_name {0}: not a valid DNS name or IP address")]
    ServerName(Shown),
    #[error(
        "no server_name, and the host of addr {0} is not a valid DNS name or IP address \
         to default to; give server_name"
    )]
    DefaultServerName(Shown),
    #[error("duplicate id {0:?}")]
    Duplicate(String),
}

impl From<InvalidTerminal> for StoreError {
    fn from(e: InvalidTerminal) -> Self {
        StoreError::Config(e.to_string())
    }
}

fn valid_server_name(name: &str) -> bool {
    rustls::pki_types::ServerName::try_from(name).is_ok()
}

/// The host of `addr` (without IPv6 brackets), if `addr` is a valid `host:port`: port
/// 1-65535; host an IPv4 address, a bracketed IPv6 address or a DNS name.
pub fn addr_host(addr: &str) -> Result<&str, &'static str> {
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an IPv6 host needs a closing ']'")?;
        let port = after.strip_prefix(':').ok_or("missing :port")?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err("not a valid IPv6 address in brackets");
        }
        (host, port)
    } else {
        let (host, port) = addr.rsplit_once(':').ok_or("missing :port")?;
        if host.contains(':') {
            return Err("an IPv6 host must be in brackets, e.g. [::1]:443");
        }
        if host.is_empty() {
            return Err("empty host");
        }
        if !valid_server_name(host) {
            return Err("host is not a valid DNS name or IP address");
        }
        (host, port)
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && matches!(port.parse::<u32>(), Ok(1..=65535));
    if !port_ok {
        return Err("port must be a number from 1 to 65535");
    }
    Ok(host)
}

impl Terminal {
    /// A validated terminal; `server_name` `None` (or empty) defaults to the host of
    /// `addr`, without brackets.
    pub fn new(id: &str, addr: &str, server_name: Option<&str>) -> Result<Self, InvalidTerminal> {
        if !valid_terminal_id(id) {
            return Err(InvalidTerminal::Id(Shown::new(id)));
        }
        let host = addr_host(addr).map_err(|reason| InvalidTerminal::Addr {
            addr: Shown::new(addr),
            reason,
        })?;
        let server_name = match server_name.filter(|s| !s.is_empty()) {
            Some(name) if valid_server_name(name) => name,
            Some(name) => return Err(InvalidTerminal::ServerName(Shown::new(name))),
            None if valid_server_name(host) => host,
            None => return Err(InvalidTerminal::DefaultServerName(Shown::new(addr))),
        };
        Ok(Terminal {
            id: id.to_string(),
            addr: addr.to_string(),
            server_name: server_name.to_string(),
            labels: Labels::default(),
        })
    }

    /// This terminal with `labels` (valid by construction).
    pub fn with_labels(self, labels: Labels) -> Terminal {
        Terminal { labels, ..self }
    }

    /// Checks a terminal built by hand (fields are public); `server_name` must be set.
    pub fn validate(&self) -> Result<(), InvalidTerminal> {
        if self.server_name.is_empty() {
            return Err(InvalidTerminal::ServerName(Shown::new("")));
        }
        Terminal::new(&self.id, &self.addr, Some(&self.server_name)).map(|_| ())
    }

    /// Whether `other` is dialed the same way: same id, address and TLS name (labels
    /// aside).
    pub fn same_endpoint(&self, other: &Terminal) -> bool {
        (&self.id, &self.addr, &self.server_name) == (&other.id, &other.addr, &other.server_name)
    }

    /// What the directory stores for this terminal (besides its id).
    pub fn entry(&self) -> Entry {
        Entry {
            addr: self.addr.clone(),
            server_name: self.server_name.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// The stored value of one terminal: JSON `{"addr":..,"server_name":..}` in Redis, and
/// its labels.
///
/// The labels are not in that JSON: Redis keeps them in a hash of their own per shard
/// (`terminal-labels:<shard>`, the text form), written by the same scripts. A previous
/// release's `posgate terminals import` rewrites the JSON of the terminals it imports
/// and knows nothing of that hash, so it leaves their labels as they were instead of
/// dropping them; its `remove` leaves a removed terminal's labels behind, which no
/// reader looks at (labels count only for a terminal in the terminals hash) and this
/// release's next write of the terminal replaces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub addr: String,
    pub server_name: String,
    #[serde(skip)]
    pub labels: Labels,
}

impl Entry {
    /// The terminal `id` with this entry.
    pub fn terminal(self, id: String) -> Terminal {
        Terminal {
            id,
            addr: self.addr,
            server_name: self.server_name,
            labels: self.labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(valid_terminal_id("store-17:till-3"));
        assert!(valid_terminal_id("A.b_c:d-9"));
        assert!(valid_terminal_id(&"x".repeat(64)));
        assert!(!valid_terminal_id(""));
        assert!(!valid_terminal_id(&"x".repeat(65)));
        assert!(!valid_terminal_id("a b"));
        assert!(!valid_terminal_id("a/b"));
        assert!(!valid_terminal_id("a,b"));
    }

    #[test]
    fn addresses() {
        assert_eq!(addr_host("pos1.example.com:443"), Ok("pos1.example.com"));
        assert_eq!(addr_host("10.0.0.1:8443"), Ok("10.0.0.1"));
        assert_eq!(addr_host("[::1]:443"), Ok("::1"));
        assert_eq!(addr_host("h:65535"), Ok("h"));
        for bad in [
            "host",
            ":443",
            "host:",
            "host:0",
            "host:65536",
            "host:+1",
            "host:99999999999",
            "::1:443",
            "[::1]443",
            "[::1:443",
            "[nope]:443",
            "bad host:443",
            "a/b:1",
        ] {
            assert!(addr_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_name_defaults_to_host() {
        let t = Terminal::new("t1", "[::1]:443", None).unwrap();
        assert_eq!(t.server_name, "::1");
        let t = Terminal::new("t1", "pos.example:443", Some("")).unwrap();
        assert_eq!(t.server_name, "pos.example");
        let t = Terminal::new("t1", "10.1.2.3:443", Some("pos-7.example")).unwrap();
        assert_eq!(t.server_name, "pos-7.example");
        assert!(matches!(
            Terminal::new("t1", "10.1.2.3:443", Some("no spaces")),
            Err(InvalidTerminal::ServerName(_))
        ));
        assert!(matches!(
            Terminal::new("t 1", "10.1.2.3:443", None),
            Err(InvalidTerminal::Id(_))
        ));
        let mut t = Terminal::new("t1", "h:1", None).unwrap();
        assert_eq!(t.validate(), Ok(()));
        t.server_name.clear();
        assert!(t.validate().is_err());
    }
}
