//! Where the Redis master is: one address (`redis://`, `rediss://`), or the master the
//! sentinels of a `redis+sentinel://` URL name. [`Endpoint::master`] answers with a
//! client for it now; following it as it moves is `follow.rs`'s.
//!
//! A lookup follows the Redis Sentinel client guidelines: ask the sentinels
//! `SENTINEL GET-MASTER-ADDR-BY-NAME <master>` and take an address whose node answers
//! `ROLE` as a master, so a demoted node is never taken for the master. All the
//! sentinels are asked at once, each within our deadline, so a dead one costs nothing
//! and a frozen one at most the deadline. Among their answers only the newest view
//! counts: the addresses named with the highest `config-epoch` (of `SENTINEL MASTER
//! <master>`). A sentinel cut off from the others during a failover still names the old
//! master, and an old master cut off from its sentinels (but not from us) still answers
//! `ROLE` as one: taking whichever sentinel answered first, or falling back to an older
//! view when the newest master does not answer (yet), could put this pod on the old
//! master while the others write to the new one, two lease tables that could hand out
//! one epoch twice. A sentinel whose ACL refuses `SENTINEL MASTER` gives no epoch; such
//! answers are used only when no sentinel gave one. (The redis crate's `SentinelClient` reads `SENTINEL MASTERS` instead, which
//! flags the master down until the whole failover has ended, replicas reconfigured:
//! up to `failover-timeout` after the new master was promoted and serving. Measured
//! here: 12 s of a master nobody would name.)
//!
//! What it does not do: hold connections or decide when to look again.

use std::time::Duration;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::join_all;
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Role,
    TlsCertificates,
};
use tracing::warn;

use super::client::{bounded, ensure_crypto_provider, tcp_settings, tls_certificates};
use super::sentinel_url::SentinelUrl;
use super::RedisOptions;
use crate::store::StoreError;

/// How the store reaches the master. See the module docs.
pub(super) enum Endpoint {
    /// One address: the master itself, or a managed Redis whose primary moves behind a
    /// DNS name (a new connection finds it).
    Direct(Client),
    Sentinel(Sentinels),
}

/// A master found through sentinels.
pub(super) struct Sentinels {
    /// One client per sentinel, in the URL's order.
    sentinels: Vec<Client>,
    master: String,
    /// How a node the sentinels name is connected to.
    node: Node,
}

/// What a connection to a node the sentinels name is made with.
struct Node {
    tls: bool,
    redis: RedisConnectionInfo,
    certs: Option<TlsCertificates>,
}

/// A TCP address, verified TLS when `tls` (the certificates come with the client).
fn addr(tls: bool, host: String, port: u16) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

impl Node {
    fn client(&self, host: String, port: u16) -> Result<Client, redis::RedisError> {
        build(
            addr(self.tls, host, port),
            self.redis.clone(),
            self.certs.clone(),
        )
    }
}

/// A client of `addr` with `redis` settings, our socket options, and `certs` if given.
fn build(
    addr: ConnectionAddr,
    redis: RedisConnectionInfo,
    certs: Option<TlsCertificates>,
) -> Result<Client, redis::RedisError> {
    let info: ConnectionInfo = addr
        .into_connection_info()?
        .set_redis_settings(redis)
        .set_tcp_settings(tcp_settings());
    match certs {
        Some(certs) => Client::build_with_tls(info, certs),
        None => Client::open(info),
    }
}

impl Endpoint {
    /// Checks `url` and the TLS files of `opts` and builds the endpoint; nothing is sent
    /// yet. Returns the endpoint and the URL with its password redacted.
    pub fn open(url: &str, opts: &RedisOptions) -> Result<(Endpoint, String), StoreError> {
        if SentinelUrl::is_sentinel(url) {
            return Self::open_sentinels(url, opts);
        }
        let redacted = redact(url);
        let invalid = |why: String| StoreError::Config(format!("Redis URL {redacted:?}: {why}"));
        let tls = url.starts_with("rediss://");
        if !tls && !url.starts_with("redis://") {
            return Err(invalid(
                "expected redis://[user:password@]host[:port][/db], rediss://..., or \
                 redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>"
                    .into(),
            ));
        }
        if tls {
            ensure_crypto_provider();
        }
        if opts.sentinel_password.is_some() {
            return Err(invalid(
                "a sentinel password is set, but the URL names no sentinels".into(),
            ));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| invalid(e.to_string()))?
            .set_tcp_settings(tcp_settings());
        let client = if opts.ca_file.is_none() && opts.client_cert.is_none() {
            // Also sets rediss:// up, with the system's trust roots.
            Client::open(info)
        } else if tls {
            Client::build_with_tls(info, tls_certificates(opts)?)
        } else {
            // Ignoring them would send in plain text what the operator meant to protect.
            return Err(invalid(
                "a CA file or client certificate is set, but only rediss:// uses TLS".into(),
            ));
        };
        let client = client.map_err(|e| invalid(e.to_string()))?;
        Ok((Endpoint::Direct(client), redacted))
    }

    fn open_sentinels(url: &str, opts: &RedisOptions) -> Result<(Endpoint, String), StoreError> {
        let parsed = SentinelUrl::parse(url)
            .map_err(|why| StoreError::Config(format!("Redis Sentinel URL: {why}")))?;
        let redacted = parsed.redacted();
        let invalid = |why: String| StoreError::Config(format!("Redis URL {redacted:?}: {why}"));
        let custom_tls = opts.ca_file.is_some() || opts.client_cert.is_some();
        if !parsed.tls && custom_tls {
            return Err(invalid(
                "a CA file or client certificate is set, but only rediss+sentinel:// uses TLS"
                    .into(),
            ));
        }
        if parsed.tls {
            ensure_crypto_provider();
        }
        // A private CA or a client certificate, for both the sentinels and the master.
        let certs = if custom_tls {
            Some(tls_certificates(opts)?)
        } else {
            None
        };
        let mut credentials = RedisConnectionInfo::default();
        if let Some(user) = &parsed.username {
            credentials = credentials.set_username(user);
        }
        if let Some(password) = &parsed.password {
            credentials = credentials.set_password(password);
        }
        let node = credentials.clone().set_db(parsed.db);
        // The sentinels take the master's credentials unless they have their own.
        let sentinel = match &opts.sentinel_password {
            Some(own) => RedisConnectionInfo::default().set_password(own),
            None => credentials,
        };
        let sentinels = parsed
            .sentinels
            .iter()
            .map(|(host, port)| {
                let addr = addr(parsed.tls, host.clone(), *port);
                build(addr, sentinel.clone(), certs.clone())
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        let sentinels = Sentinels {
            sentinels,
            master: parsed.master,
            node: Node {
                tls: parsed.tls,
                redis: node,
                certs,
            },
        };
        Ok((Endpoint::Sentinel(sentinels), redacted))
    }

    /// A client for the master as of now, found within `limit`.
    pub async fn master(&self, limit: Duration) -> Result<Client, StoreError> {
        match self {
            Endpoint::Direct(client) => Ok(client.clone()),
            Endpoint::Sentinel(s) => s.master(limit).await,
        }
    }

    /// The sentinels' clients (none for a direct endpoint), for their `+switch-master`
    /// announcements.
    pub fn sentinels(&self) -> &[Client] {
        match self {
            Endpoint::Direct(_) => &[],
            Endpoint::Sentinel(s) => &s.sentinels,
        }
    }

    /// The master name sentinels know, if the master is found through them.
    pub fn master_name(&self) -> Option<&str> {
        match self {
            Endpoint::Direct(_) => None,
            Endpoint::Sentinel(s) => Some(&s.master),
        }
    }
}

/// The master as one sentinel names it, with the config epoch of that sentinel's view
/// (`None`: the sentinel would not say).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    epoch: Option<u64>,
    host: String,
    port: u16,
}

/// Set once a sentinel refused `SENTINEL MASTER`, so that is said once per process, not
/// at every lookup.
static EPOCH_REFUSAL_LOGGED: AtomicBool = AtomicBool::new(false);

impl Sentinels {
    /// Asks every sentinel at once (each within `limit`), then tries the addresses of
    /// the newest view ([`newest_view`]); the first whose node answers `ROLE` as a master
    /// wins. The error names what each sentinel and node said, when none did.
    async fn master(&self, limit: Duration) -> Result<Client, StoreError> {
        let answers = join_all(self.sentinels.iter().map(|s| bounded(limit, self.ask(s)))).await;
        let mut why = Vec::new();
        let mut named = Vec::new();
        for (sentinel, answer) in self.sentinels.iter().zip(answers) {
            match answer {
                Ok(n) => named.push(n),
                Err(e) => why.push(format!("sentinel {}: {e}", address(sentinel))),
            }
        }
        for n in newest_view(named) {
            let epoch = n.epoch.map_or("unknown".into(), |e| e.to_string());
            let at = format!("{}:{} (config epoch {epoch})", n.host, n.port);
            match bounded(limit, self.check(n.host, n.port)).await {
                Ok(client) => return Ok(client),
                Err(e) => why.push(format!("{at}: {e}")),
            }
        }
        Err(StoreError::Unavailable(format!(
            "no sentinel named a master {:?} that answers as one: {}",
            self.master,
            why.join("; ")
        )))
    }

    /// What one sentinel names, and its config epoch. The epoch is read first: should
    /// the sentinel switch to a new master between the two commands, the new address
    /// comes with the old epoch (tried later than it deserves), never the old address
    /// with the new epoch. A sentinel that refuses `SENTINEL MASTER` (an ACL that allows
    /// only the address lookup, as before this was read) gives no epoch.
    async fn ask(&self, sentinel: &Client) -> redis::RedisResult<Named> {
        let mut conn = sentinel.get_multiplexed_async_connection().await?;
        let master: redis::RedisResult<HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master)
            .query_async(&mut conn)
            .await;
        let epoch = match master {
            Ok(fields) => fields.get("config-epoch").and_then(|e| e.parse().ok()),
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                return Err(e)
            }
            Err(e) => {
                if !EPOCH_REFUSAL_LOGGED.swap(true, Ordering::Relaxed) {
                    warn!(
                        sentinel = %address(sentinel), error = %e,
                        "a sentinel refused SENTINEL MASTER: its answers count only when no \
                         sentinel gives a config epoch (allow it in the sentinels' ACL)"
                    );
                }
                None
            }
        };
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        let Some((host, port)) = named else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "this sentinel does not monitor the master name",
            )));
        };
        Ok(Named { epoch, host, port })
    }

    /// A client of the named node if it answers `ROLE` as a master.
    async fn check(&self, host: String, port: u16) -> redis::RedisResult<Client> {
        let client = self.node.client(host, port)?;
        let mut node = client.get_multiplexed_async_connection().await?;
        match redis::cmd("ROLE").query_async::<Role>(&mut node).await? {
            Role::Primary { .. } => Ok(client),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the node a sentinel named is not a master (yet)",
            ))),
        }
    }
}

/// The masters worth trying: those named with the highest config epoch any sentinel
/// gave (the newest failover it knows of), in the URL's order, each address once. Never
/// an older view, even when the newest master does not answer (yet): the master of an
/// older view is the one a failover left behind. Answers without an epoch count only
/// when no answer has one.
fn newest_view(named: Vec<Named>) -> Vec<Named> {
    let newest = named.iter().filter_map(|n| n.epoch).max();
    let mut view: Vec<Named> = Vec::new();
    for n in named.into_iter().filter(|n| n.epoch == newest) {
        if !view.iter().any(|v| v.host == n.host && v.port == n.port) {
            view.push(n);
        }
    }
    view
}

/// Where `client` connects, for logs (`host:port`).
pub(super) fn address(client: &Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// Whether a failed call's error says the connection may no longer lead to the master:
/// a node that is (now) a replica or loading its data, or a lost connection.
pub(super) fn may_have_moved(e: &StoreError) -> bool {
    match e {
        StoreError::Refused { code, .. } => {
            matches!(code.as_str(), "READONLY" | "MASTERDOWN" | "LOADING")
        }
        StoreError::Unavailable(_) => true,
        _ => false,
    }
}

/// `url` with any password replaced by `***`, for logs and errors. Splits at the last
/// `@`, so a password containing an unescaped `/` or `@` is still hidden (an `@` in the
/// path would only over-redact).
pub(super) fn redact(url: &str) -> String {
    if SentinelUrl::is_sentinel(url) {
        return SentinelUrl::parse(url)
            .map(|u| u.redacted())
            .unwrap_or_else(|_| "<unparseable Redis Sentinel URL>".into());
    }
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let user = rest[..at].split(':').next().unwrap_or_default();
    let sep = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{sep}{user}:***{}", &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(epoch: Option<u64>, host: &str, port: u16) -> Named {
        Named {
            epoch,
            host: host.into(),
            port,
        }
    }

    #[test]
    fn only_the_newest_view_is_tried_each_address_once() {
        let answers = vec![
            named(Some(3), "old", 1),
            named(Some(5), "new", 2),
            named(None, "unknown", 4),
            named(Some(5), "new", 2),
            named(Some(4), "other", 3),
            named(Some(5), "also-new", 5),
        ];
        assert_eq!(
            newest_view(answers),
            vec![named(Some(5), "new", 2), named(Some(5), "also-new", 5)]
        );
        // Without any epoch, every answer counts, in the order the sentinels are listed.
        let unknown = vec![
            named(None, "b", 2),
            named(None, "a", 1),
            named(None, "b", 2),
        ];
        assert_eq!(newest_view(unknown.clone()), unknown[..2].to_vec());
        assert!(newest_view(Vec::new()).is_empty());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("rediss://:secret@h"), "rediss://:***@h");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("redis://u:p/a@ss@h:1/0"), "redis://u:***@h:1/0");
        assert!(!redact("u:p@a:b@h").contains("p@a"));
        assert_eq!(
            redact("redis+sentinel://u:secret@h1,h2:1/m"),
            "redis+sentinel://u:***@h1:26379,h2:1/m"
        );
        assert!(!redact("redis+sentinel://u:secret@h1,h2:x/m").contains("secret"));
    }

    #[test]
    fn bad_settings_are_config_errors_without_the_password() {
        let with_sentinel_password = RedisOptions {
            sentinel_password: Some("other".into()),
            ..RedisOptions::default()
        };
        for (url, opts) in [
            ("http://u:topsecret@h:6379", RedisOptions::default()),
            ("redis://u:topsecret@h:notaport/", RedisOptions::default()),
            ("redis+sentinel://u:topsecret@h:1", RedisOptions::default()),
            ("redis://u:topsecret@h:1", with_sentinel_password),
        ] {
            match Endpoint::open(url, &opts) {
                Err(StoreError::Config(why)) => assert!(!why.contains("topsecret"), "{why}"),
                other => panic!("{url}: {:?}", other.map(|_| ())),
            }
        }
        let tls_files = RedisOptions {
            ca_file: Some("ca.pem".into()),
            ..RedisOptions::default()
        };
        match Endpoint::open("redis+sentinel://h:1/m", &tls_files) {
            Err(StoreError::Config(why)) => assert!(why.contains("rediss+sentinel"), "{why}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(matches!(
            Endpoint::open(
                "redis+sentinel://u:p@h1:1,h2:2/m/3",
                &RedisOptions::default()
            ),
            Ok((Endpoint::Sentinel(_), _))
        ));
    }
}
