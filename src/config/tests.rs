//! Flag parsing and resolution: defaults, environment variables, errors that name the
//! flag, and secrets that never show in `Debug` output.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;

use super::*;

/// Clap reads `POSGATE_*` from the process environment while parsing; tests that
/// parse hold this lock so one test's variables never leak into another's parse.
static ENV_LOCK: Mutex<()> = Mutex::new(());

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// Parses a whitespace-separated command line.
fn parse(args: &str) -> Result<ServeArgs, clap::Error> {
    let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let argv = std::iter::once("posgate").chain(args.split_whitespace());
    Cli::try_parse_from(argv).map(|c| c.serve)
}

const SECRET: &str = "0123456789abcdef-secret";
const TOKENS: &str = "acme:0123456789abcdef-token";

/// An environment with only a cluster secret and API tokens (plus `extra`).
fn env_with(extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = [(CLUSTER_SECRET_ENV, SECRET), (API_TOKENS_ENV, TOKENS)]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

fn resolve(args: &str) -> Result<(PodConfig, StoreConfig, SocketAddr), ConfigError> {
    parse(args)
        .expect("flags parse")
        .resolve_with(env_with(&[]))
}

#[test]
fn defaults_resolve() {
    let (config, store, listen) = resolve("").unwrap();
    assert_eq!(config.core, CoreConfig::default());
    assert_eq!(
        (config.cluster.as_str(), config.store_timeout),
        ("default", DEFAULT_STORE_TIMEOUT)
    );
    assert!(config.cluster_secret.is_some());
    assert_eq!(listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(store.redis_url, "redis://127.0.0.1:6379");
    // <hostname>-<pid>-<6 random lowercase alphanumerics>
    let id = config.pod_id.as_str();
    let (rest, suffix) = id.rsplit_once('-').unwrap();
    assert!(rest.ends_with(&format!("-{}", std::process::id())), "{id}");
    let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    assert!(suffix.len() == 6 && suffix.bytes().all(lower_alnum), "{id}");
    let url = &config.advertise_url;
    assert!(
        url.starts_with("http://") && url.ends_with(":8080"),
        "{url}"
    );
}

#[test]
fn flags_derive_dependent_defaults() {
    let (config, _, _) = resolve("--listen 127.0.0.1:9000 --member-ttl 30s --pod-id p1").unwrap();
    assert_eq!(config.advertise_url, "http://127.0.0.1:9000");
    assert_eq!(config.core.heartbeat_interval, Duration::from_secs(10));
    assert_eq!(config.pod_id.as_str(), "p1");
    let (config, _, _) = resolve("--advertise-url https://pod-1.gw:8443/").unwrap();
    assert_eq!(config.advertise_url, "https://pod-1.gw:8443");
}

#[test]
fn environment_variables_set_flags_and_flags_win() {
    let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("POSGATE_LEASE_TTL", "20s");
    std::env::set_var("POSGATE_INSECURE", "true");
    let from_env = Cli::try_parse_from(["posgate"]);
    let overridden = Cli::try_parse_from(["posgate", "--lease-ttl", "30s"]);
    std::env::remove_var("POSGATE_LEASE_TTL");
    std::env::remove_var("POSGATE_INSECURE");
    let from_env = from_env.unwrap().serve;
    assert_eq!(from_env.lease_ttl, Duration::from_secs(20));
    assert!(from_env.insecure);
    assert_eq!(overridden.unwrap().serve.lease_ttl, Duration::from_secs(30));
}

/// Values clap cannot refuse alone (relations between flags); `tests/cli.rs` covers
/// the ones the parser refuses.
#[test]
fn invalid_values_name_the_flag() {
    for (args, flag) in [
        ("--lease-ttl 2s", "lease-ttl"),
        ("--shards 0", "shards"),
        ("--poll-interval 0s", "poll-interval"),
        ("--heartbeat-interval 10s", "heartbeat-interval"),
        ("--store-timeout 10s", "store-timeout"),
        ("--redis-url http://x", "redis-url"),
    ] {
        let err = resolve(args).unwrap_err();
        let line = err.to_string();
        assert!(line.starts_with(&format!("invalid --{flag}: ")), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert_eq!(blamed(&err), flag, "{line}");
    }
}

/// The flag or variable an error blames.
fn blamed(err: &ConfigError) -> &'static str {
    match err {
        ConfigError::Invalid { flag, .. } => flag,
        ConfigError::InvalidEnv { var, .. } => var,
        ConfigError::MissingSecret | ConfigError::MissingTokens => "nothing",
    }
}

#[test]
fn cluster_secret_sources() {
    let none = |_: &str| None;
    let resolved = |args: &str, env: &dyn Fn(&str) -> Option<String>| {
        let config = parse(args)
            .unwrap()
            .resolve_with(env)
            .map(|(config, _, _)| config);
        config.map(|config| config.cluster_secret)
    };
    assert_eq!(resolved("", &none).unwrap_err(), ConfigError::MissingSecret);
    assert!(resolved("--insecure", &none).unwrap().is_none());
    let short = resolved("", &|_: &str| Some("short".to_string())).unwrap_err();
    assert_eq!(blamed(&short), CLUSTER_SECRET_ENV);

    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, format!("  {SECRET}\n").as_bytes()).unwrap();
    let flag = format!("--cluster-secret-file {}", file.path().display());
    // (--insecure only because `none` has no API tokens either.)
    assert!(resolved(&format!("{flag} --insecure"), &none)
        .unwrap()
        .is_some());
    let both = resolved(&flag, &env_with(&[])).unwrap_err();
    assert_eq!(blamed(&both), "cluster-secret-file");
}

#[test]
fn api_tokens_and_push_limits() {
    let (config, _, _) = resolve("--max-push-bytes 1024 --max-inflight 7").unwrap();
    let tokens = config.api_tokens.as_ref().expect("tokens from the env");
    assert!(matches!(
        tokens.grant_of("0123456789abcdef-token"),
        Some(crate::credentials::Grant::Tenant { tenant, .. }) if tenant.0 == "acme"
    ));
    assert_eq!(config.push.max_push_bytes, 1024);
    assert_eq!(config.push.max_inflight, 7);
    assert_eq!(config.push.max_inflight_per_tenant, 4, "half, rounded up");
    assert_eq!(config.push.body_read_timeout, Duration::from_secs(10));
    assert_eq!(config.push.push_path, "/push");
    assert!(!format!("{config:?}").contains("abcdef-token"));
    // Secret but no tokens: refused unless --insecure.
    let secret_only = |name: &str| (name == CLUSTER_SECRET_ENV).then(|| SECRET.to_string());
    let refused = parse("").unwrap().resolve_with(secret_only).unwrap_err();
    assert_eq!(refused, ConfigError::MissingTokens);
    let (open, _, _) = parse("--insecure")
        .unwrap()
        .resolve_with(secret_only)
        .unwrap();
    assert!(open.api_tokens.is_none());
    for (args, flag) in [
        ("--max-push-bytes 0", "max-push-bytes"),
        ("--max-push-bytes 999999999", "max-push-bytes"),
        ("--max-inflight 0", "max-inflight"),
        ("--max-waiting-per-terminal 0", "max-waiting-per-terminal"),
        ("--idempotency-ttl 0s", "idempotency-ttl"),
        ("--max-inflight-per-tenant 0", "max-inflight-per-tenant"),
        (
            "--max-inflight 10 --max-inflight-per-tenant 11",
            "max-inflight-per-tenant",
        ),
        ("--body-read-timeout 0s", "body-read-timeout"),
        ("--pos-push-path push", "pos-push-path"),
    ] {
        assert_eq!(blamed(&resolve(args).unwrap_err()), flag, "{args}");
    }
}

#[test]
fn redis_password_is_injected_and_never_printed() {
    let env = env_with(&[(REDIS_PASSWORD_ENV, "p@ss word")]);
    let (config, store, _) = parse("").unwrap().resolve_with(env).unwrap();
    assert_eq!(store.redis_url, "redis://:p%40ss%20word@127.0.0.1:6379");
    let debug = format!("{store:?} {config:?}");
    assert!(!debug.contains("p%40ss"), "{debug}");
    assert!(!debug.contains(SECRET), "{debug}");
    assert!(debug.contains("redis://:***@127.0.0.1:6379"), "{debug}");

    let env = env_with(&[(REDIS_PASSWORD_ENV, "other")]);
    let twice = parse("--redis-url redis://u:pw@h:6379")
        .unwrap()
        .resolve_with(env);
    assert_eq!(blamed(&twice.unwrap_err()), REDIS_PASSWORD_ENV);
    let unix = redact_url("redis+unix:///r.sock?db=1&pass=pw");
    assert_eq!(unix, "redis+unix:///r.sock?***");
    assert_eq!(redact_url("redis://u:pw@h:1/2"), "redis://u:***@h:1/2");
}

#[test]
fn redis_tls_files_need_rediss_and_come_in_pairs() {
    let tls = "--redis-url rediss://h:6380 --redis-ca-file /ca.pem \
               --redis-client-cert /c.pem --redis-client-key /k.pem";
    let (_, store, _) = resolve(tls).unwrap();
    assert_eq!(store.redis_ca_file, Some("/ca.pem".into()));
    let cert = store.redis_client_cert.clone().unwrap();
    assert_eq!(
        (cert.cert_file, cert.key_file),
        ("/c.pem".into(), "/k.pem".into())
    );
    assert!(format!("{store:?}").contains("/k.pem"), "{store:?}");
    let (_, plain, _) = resolve("").unwrap();
    assert_eq!((plain.redis_ca_file, plain.redis_client_cert), (None, None));

    for (args, flag) in [
        ("--redis-ca-file /ca.pem", "redis-ca-file"),
        (
            "--redis-client-cert /c.pem --redis-client-key /k.pem",
            "redis-client-cert",
        ),
    ] {
        let err = resolve(args).unwrap_err();
        assert_eq!(blamed(&err), flag, "{err}");
        assert!(err.to_string().contains("rediss://"), "{err}");
    }
    for half in ["--redis-client-cert /c.pem", "--redis-client-key /k.pem"] {
        let err = parse(&format!("--redis-url rediss://h {half}")).err();
        assert!(err.is_some(), "{half} alone must be refused");
    }

    // From the environment, like every flag; the pair rule holds there too.
    let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("POSGATE_REDIS_CA_FILE", "/env-ca.pem");
    std::env::set_var("POSGATE_REDIS_CLIENT_KEY", "/env-k.pem");
    let half = Cli::try_parse_from(["posgate"]).err();
    std::env::set_var("POSGATE_REDIS_CLIENT_CERT", "/env-c.pem");
    let whole = Cli::try_parse_from(["posgate"]);
    for var in [
        "POSGATE_REDIS_CA_FILE",
        "POSGATE_REDIS_CLIENT_CERT",
        "POSGATE_REDIS_CLIENT_KEY",
    ] {
        std::env::remove_var(var);
    }
    assert!(half.is_some(), "a client key without a certificate");
    let whole = whole.unwrap().serve;
    assert_eq!(whole.redis.redis_ca_file, Some("/env-ca.pem".into()));
    assert_eq!(whole.redis.redis_client_cert, Some("/env-c.pem".into()));
    assert_eq!(whole.redis.redis_client_key, Some("/env-k.pem".into()));
}

#[test]
fn pos_flags_default_and_resolve() {
    let (config, _, _) = resolve("").unwrap();
    assert_eq!(config.pos, PosConfig::default());
    let (config, _, _) = resolve(
        "--pos-ca ca.pem --pos-client-cert c.pem --pos-client-key k.pem --pos-keepalive 3s \
         --pos-keepalive-timeout 1s --dial-rate 1000 --dial-concurrency 8 --dial-timeout 2s \
         --hello-rate 300 --dial-backoff-base 500ms --dial-backoff-cap 10s --directory-poll 5s",
    )
    .unwrap();
    let pos = config.pos;
    assert_eq!(pos.tls.ca_file, Some("ca.pem".into()));
    let client = pos.tls.client.expect("client identity");
    assert_eq!(
        (client.cert_file, client.key_file),
        ("c.pem".into(), "k.pem".into())
    );
    assert_eq!(
        (pos.keepalive.interval, pos.keepalive.timeout),
        (Duration::from_secs(3), Duration::from_secs(1))
    );
    assert_eq!((pos.dial_rate.get(), pos.dial_concurrency), (1000, 8));
    assert_eq!(pos.hello_rate.get(), 300);
    assert_eq!(pos.dial_timeout, Duration::from_secs(2));
    assert_eq!(
        (pos.backoff.base, pos.backoff.cap),
        (Duration::from_millis(500), Duration::from_secs(10))
    );
    assert_eq!(pos.directory_poll, Duration::from_secs(5));
}

#[test]
fn pos_flags_are_checked() {
    for (args, flag) in [
        ("--dial-rate 0", "dial-rate"),
        ("--dial-concurrency 0", "dial-concurrency"),
        ("--hello-rate 0", "hello-rate"),
        ("--dial-timeout 0s", "dial-timeout"),
        (
            "--dial-backoff-base 2s --dial-backoff-cap 1s",
            "dial-backoff-cap",
        ),
        ("--directory-poll 6s", "directory-poll"),
        ("--directory-poll 0s", "directory-poll"),
    ] {
        match resolve(args) {
            Err(ConfigError::Invalid { flag: got, .. }) => assert_eq!(got, flag, "{args}"),
            other => panic!("{args}: expected an error about --{flag}, got {other:?}"),
        }
    }
    assert!(parse("--pos-client-cert c.pem").is_err());
    assert!(parse("--pos-client-key k.pem").is_err());
}

#[test]
fn tls_flags_come_in_pairs_and_make_the_default_advertise_url_https() {
    let (config, _, _) = resolve("--listen 127.0.0.1:8443").unwrap();
    assert_eq!(
        (config.tls, config.peers),
        (None, crate::peer::tls::PeerVerify::default())
    );
    let (config, _, _) = resolve(
        "--listen 127.0.0.1:8443 --tls-cert /tls/tls.crt --tls-key /tls/tls.key \
         --peer-ca-file /tls/ca.crt --peer-tls-name posgate-peer.posgate.svc",
    )
    .unwrap();
    let files = config.tls.unwrap();
    assert_eq!(
        (files.cert_file.to_str(), files.key_file.to_str()),
        (Some("/tls/tls.crt"), Some("/tls/tls.key"))
    );
    assert_eq!(config.advertise_url, "https://127.0.0.1:8443");
    assert_eq!(
        config.peers.ca_file.as_deref(),
        Some(std::path::Path::new("/tls/ca.crt"))
    );
    assert_eq!(
        config.peers.name.map(|n| n.to_str().into_owned()),
        Some("posgate-peer.posgate.svc".to_string())
    );
    for (args, flag) in [
        ("--tls-cert /tls/tls.crt", "tls-cert"),
        ("--tls-key /tls/tls.key", "tls-key"),
        ("--peer-tls-name 10.0.0.1", "peer-tls-name"),
        ("--peer-tls-name not..valid", "peer-tls-name"),
        (
            "--tls-cert c --tls-key k --advertise-url http://pod:8080",
            "advertise-url",
        ),
    ] {
        let err = resolve(args).unwrap_err();
        assert_eq!(blamed(&err), flag, "{err}");
    }
}

#[test]
fn reloadable_files_are_the_secret_and_certificate_files() {
    let args = parse(
        "--api-tokens-file /s/tokens --cluster-secret-file /s/secret --pos-ca /s/pos-ca \
         --tls-cert /s/tls.crt --tls-key /s/tls.key --redis-ca-file /s/redis-ca",
    )
    .unwrap();
    let files: Vec<String> = args
        .reloadable_files()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // Redis settings are applied once, at start; a reload does not read them.
    assert_eq!(
        files,
        [
            "/s/tokens",
            "/s/secret",
            "/s/pos-ca",
            "/s/tls.crt",
            "/s/tls.key"
        ]
    );
    assert_eq!(args.reload_poll_interval, Duration::from_secs(10));
    let off = parse("--reload-poll-interval 0s").unwrap();
    assert!(off.reload_poll_interval.is_zero());
}

#[test]
fn connection_limits_default_to_a_share_of_the_open_file_limit() {
    let (config, _, _) = resolve("").unwrap();
    let limits = config.connections;
    assert_eq!(limits.header_read_timeout, Duration::from_secs(10));
    assert_eq!(limits.idle_timeout, Duration::from_secs(120));
    assert_eq!(limits.max_streams, 200);
    let fd_limit = super::connection_args::fd_limit();
    assert_eq!(
        limits.max_connections as u64,
        (fd_limit / 4).min(super::connection_args::MAX_DEFAULT_CONNECTIONS)
    );
    let args = parse("").unwrap().connections;
    let share = |fd_limit| args.resolve(fd_limit).map(|l| l.max_connections);
    assert_eq!(share(1_024), Ok(256));
    assert_eq!(share(20_000), Ok(5_000));
    assert_eq!(share(1 << 20), Ok(10_000), "at most 10,000 by default");
    assert_eq!(share(u64::MAX), Ok(10_000), "an unlimited process");
    let too_low = share(40).unwrap_err();
    assert_eq!(blamed(&too_low), "max-connections");
    assert!(too_low.to_string().contains("ulimit -n"), "{too_low}");
    let explicit = parse("--max-connections 500").unwrap().connections;
    assert_eq!(explicit.resolve(1_024).map(|l| l.max_connections), Ok(500));
    let over = explicit.resolve(998).unwrap_err().to_string();
    assert!(over.contains("half the open-file limit of 998"), "{over}");
    for (args, flag) in [
        ("--header-read-timeout 0s", "header-read-timeout"),
        ("--idle-timeout 90s", "idle-timeout"),
        // Far enough ahead to overflow an instant: a clear error, not a panic.
        ("--idle-timeout 500000000years", "idle-timeout"),
        ("--header-read-timeout 25h", "header-read-timeout"),
        ("--max-connections 15", "max-connections"),
        (
            "--max-streams-per-connection 0",
            "max-streams-per-connection",
        ),
    ] {
        assert_eq!(blamed(&resolve(args).unwrap_err()), flag, "{args}");
    }
}
