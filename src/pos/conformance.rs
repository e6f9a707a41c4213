//! The terminal conformance kit behind `posgate conformance`: dials a terminal
//! implementation the way a pod does ([`Dialer`]: TLS verified for its `server_name`,
//! ALPN `h2`, HTTP/2) and checks the rules of `docs/pos-protocol.md` one by one, each
//! on connections of its own, reporting pass, fail (with what the terminal did) or
//! skipped (a check it depends on failed).
//!
//! What the terminal is left with: its `highest_epoch` raised by two above what it was
//! (the kit learns it from the first refusal, so it never jumps to a far-future epoch
//! that would fence real pods out), and a few test keys under tenants starting with
//! `posgate-conformance`. Run it against a terminal that is not in service: its real
//! owner's session is superseded by the kit's.
//!
//! Not for: the terminal's payload handling (the pod never reads its body) or load.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use rustls::ClientConfig;

use super::dialer::{Dialer, DialerConfig, Keepalive};
use super::session::{self, RequestSender, Session};
use super::wire::{self, PosPush, DUPLICATE_HEADER, STALE_EPOCH_HEADER};
use crate::core::{Epoch, PodId};
use crate::store::directory::Terminal;

/// How binding a rule is (RFC 2119, as `docs/pos-protocol.md` uses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    Must,
    Should,
}

/// What one check found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", content = "detail", rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail(String),
    Skipped(String),
}

/// One rule checked.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// Stable name, e.g. `stale-hello-refused`.
    pub id: &'static str,
    pub level: Level,
    /// Where `docs/pos-protocol.md` states it, e.g. `§4.2`.
    pub rule: &'static str,
    pub outcome: Outcome,
}

/// The tenant of the kit's pushes.
pub const TENANT: &str = "posgate-conformance";
/// How long one request may take.
const ANSWER: Duration = Duration::from_secs(5);
/// How quickly a terminal should answer (`docs/pos-protocol.md` §5, "Answer time"): a
/// fifth of a push's default deadline (`crate::push::DEFAULT_TIMEOUT`, a layer above
/// this one, so `tests/conformance.rs` holds the two together), which also covers the
/// wait for a session, the forward between pods and the network.
pub const PROMPT: Duration = Duration::from_secs(1);
/// Pushes the kit sends at once on one session.
const AT_ONCE: usize = 8;
/// How long a superseded session may stay open (the protocol's grace, plus margin).
const SUPERSEDE_GRACE: Duration = Duration::from_secs(5);

/// How the kit names itself in `posgate-pod`.
pub const POD: &str = "posgate-conformance";
/// The kit's PING keep-alive: short, so an idle connection sees several PINGs within
/// [`PING_WATCH`].
const KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_millis(250),
    timeout: Duration::from_secs(1),
};
/// How long an idle connection must stay up while PINGed.
const PING_WATCH: Duration = Duration::from_secs(2);

/// Runs every check against `terminal`, dialing with `tls` (the CA it verifies the
/// terminal against, the client certificate it presents); `push_path` is the
/// deployment's push path (`/push`).
pub async fn run(tls: Arc<ClientConfig>, terminal: &Terminal, push_path: &str) -> Vec<Check> {
    let mut config = DialerConfig::new(tls, PodId::new(POD).expect("a valid pod id"));
    config.keepalive = KEEPALIVE;
    let dialer = Dialer::new(config);
    let mut kit = Kit {
        dialer: &dialer,
        terminal,
        push_path,
        checks: Vec::new(),
        slowest: Mutex::default(),
    };
    kit.run().await;
    // A check not reached (a check it depends on failed) is reported skipped; the
    // table is in the order of `ALL` either way.
    ALL.iter()
        .map(|&(id, level, rule)| {
            let found = kit.checks.iter().find(|c| c.id == id).cloned();
            found.unwrap_or(Check {
                id,
                level,
                rule,
                outcome: Outcome::Skipped("a check it depends on failed".into()),
            })
        })
        .collect()
}

struct Kit<'a> {
    dialer: &'a Dialer,
    terminal: &'a Terminal,
    push_path: &'a str,
    checks: Vec<Check>,
    /// The slowest answer so far, and to what (`POST /push`).
    slowest: Mutex<(Duration, String)>,
}

type Answer = (StatusCode, http::HeaderMap);

impl Kit<'_> {
    fn record(&mut self, id: &'static str, level: Level, rule: &'static str, outcome: Outcome) {
        self.checks.push(Check {
            id,
            level,
            rule,
            outcome,
        });
    }

    fn check(&mut self, id: &'static str, level: Level, rule: &'static str, r: Result<(), String>) {
        let outcome = match r {
            Ok(()) => Outcome::Pass,
            Err(why) => Outcome::Fail(why),
        };
        self.record(id, level, rule, outcome);
    }

    async fn connect(&self) -> Result<Session, String> {
        self.dialer
            .connect(self.terminal)
            .await
            .map_err(|e| e.to_string())
    }

    async fn send(&self, session: &mut Session, request: Request<Bytes>) -> Result<Answer, String> {
        self.send_on(&mut session.sender(), request).await
    }

    /// Sends `request` on `sender` (several may be in flight on one connection) and
    /// notes how long the answer took.
    async fn send_on(
        &self,
        sender: &mut RequestSender,
        request: Request<Bytes>,
    ) -> Result<Answer, String> {
        let what = format!("{} {}", request.method(), request.uri().path());
        let started = Instant::now();
        let response = tokio::time::timeout(ANSWER, session::send(sender, request))
            .await
            .map_err(|_| format!("no answer within {ANSWER:?}"))?
            .map_err(|e| format!("request failed: {e}"))?;
        let took = started.elapsed();
        let mut slowest = self.slowest.lock().unwrap_or_else(PoisonError::into_inner);
        if took > slowest.0 {
            *slowest = (took, what);
        }
        Ok((response.status(), response.headers().clone()))
    }

    /// A pod's hello ([`wire::hello`]) with `epoch` as the header's text, so a malformed
    /// one can be sent too.
    fn hello_request(&self, epoch: &str) -> Request<Bytes> {
        let origin = format!("https://{}", self.terminal.server_name);
        let mut hello =
            wire::hello(&origin, 0, self.dialer.pod(), &self.terminal.id).expect("a valid hello");
        let epoch = http::HeaderValue::from_str(epoch).expect("an ASCII epoch");
        hello.headers_mut().insert(wire::EPOCH_HEADER, epoch);
        hello
    }

    async fn hello(&self, session: &mut Session, epoch: Epoch) -> Result<Answer, String> {
        self.send(session, self.hello_request(&epoch.to_string()))
            .await
    }

    /// A pod's push ([`wire::push`]) with a JSON body and its `content-type`.
    fn push_request(&self, key: &str, tenant: &str, epoch: Epoch) -> Request<Bytes> {
        const JSON: HeaderValue = HeaderValue::from_static("application/json");
        wire::push(&PosPush {
            terminal: &self.terminal.id,
            server_name: &self.terminal.server_name,
            path: self.push_path,
            tenant,
            key,
            epoch,
            pod: self.dialer.pod(),
            content_type: Some(&JSON),
            body: Bytes::from_static(b"{\"conformance\":true}"),
            queued: None,
            trace: None,
        })
        .expect("a valid push")
    }

    async fn push(
        &self,
        session: &mut Session,
        key: &str,
        tenant: &str,
        epoch: Epoch,
    ) -> Result<Answer, String> {
        self.send(session, self.push_request(key, tenant, epoch))
            .await
    }

    async fn run(&mut self) {
        // §1: TLS verified for the server name, ALPN h2, HTTP/2 — everything else needs it.
        let mut first = match self.connect().await {
            Ok(session) => session,
            Err(why) => {
                self.record("tls-h2", Level::Must, "§1", Outcome::Fail(why));
                return;
            }
        };
        self.record("tls-h2", Level::Must, "§1", Outcome::Pass);

        // The terminal's highest epoch: a hello with 0 is accepted by a fresh terminal
        // and refused with the highest by any other.
        let base = match self.hello(&mut first, 0).await {
            Ok((StatusCode::OK, _)) => 0,
            Ok((StatusCode::CONFLICT, h)) => match stale_epoch(&h) {
                Some(highest) => highest,
                None => {
                    let why = "a 409 without a numeric posgate-stale-epoch".to_string();
                    self.record("hello-accepted", Level::Must, "§4.4", Outcome::Fail(why));
                    return;
                }
            },
            Ok((status, _)) => {
                let why = format!("hello with epoch 0 answered {status}");
                self.record("hello-accepted", Level::Must, "§4.4", Outcome::Fail(why));
                return;
            }
            Err(why) => {
                self.record("hello-accepted", Level::Must, "§4.4", Outcome::Fail(why));
                return;
            }
        };
        let Some(e2) = base.checked_add(2) else {
            let why = format!(
                "the terminal's highest epoch is {base}: no hello can pass it; reset its \
                 fence (§3)"
            );
            self.record("hello-accepted", Level::Must, "§4.4", Outcome::Fail(why));
            return;
        };
        let e1 = base + 1;

        // §4.4 accepted; §5 pushes, duplicates, per-tenant keys.
        let mut a = first;
        let accepted = expect_ok(self.hello(&mut a, e1).await, "hello with a higher epoch");
        let hello_ok = accepted.is_ok();
        self.check("hello-accepted", Level::Must, "§4.4", accepted);
        if !hello_ok {
            return;
        }
        // Unique per run, so a terminal's window of earlier runs' keys does not matter.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let key = format!("conformance-{started}");
        let taken = self.push(&mut a, &key, TENANT, e1).await;
        self.check("push-accepted", Level::Must, "§5.5", taken_fresh(taken));
        let again = self.push(&mut a, &key, TENANT, e1).await;
        self.check("duplicate-marked", Level::Must, "§5.4", duplicate(again));
        let other_tenant = format!("{TENANT}-other");
        let other = self.push(&mut a, &key, &other_tenant, e1).await;
        self.check("key-per-tenant", Level::Must, "§5", taken_fresh(other));

        // §2: a push whose sender gave no content type goes without the header.
        let mut bare = self.push_request(&format!("{key}-no-content-type"), TENANT, e1);
        bare.headers_mut().remove(header::CONTENT_TYPE);
        let bare = taken_fresh(self.send(&mut a, bare).await);
        self.check("push-without-content-type", Level::Must, "§2", bare);

        // §2: headers the terminal does not know never refuse a push: a header of a
        // later release, and malformed trace headers (a terminal that traces must not
        // refuse a push over them either).
        let mut unknown = self.push_request(&format!("{key}-unknown-headers"), TENANT, e1);
        let headers = unknown.headers_mut();
        headers.insert("posgate-conformance-later", HeaderValue::from_static("1"));
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-not-a-trace-context"),
        );
        headers.insert("tracestate", HeaderValue::from_static("=,="));
        let unknown = taken_fresh(self.send(&mut a, unknown).await);
        self.check("unknown-headers-ignored", Level::Must, "§2", unknown);

        // §2 and §5.4: the longest key, tenant and pod id the pod sends, with every
        // character they may hold, taken whole and deduplicated.
        let longest = self.longest_ids(&mut a, &key, e1).await;
        self.check(
            "max-length-key-deduplicated",
            Level::Must,
            "§2, §5.4",
            longest,
        );

        // §5: live pushes share the session, several at once.
        let at_once = self.at_once(&a, &key, e1).await;
        self.check("concurrent-pushes", Level::Must, "§5", at_once);

        // §5.3: no push without an accepted hello on the connection.
        let without = match self.connect().await {
            Ok(mut b) => {
                let answer = self
                    .push(&mut b, &format!("{key}-no-hello"), TENANT, e1)
                    .await;
                b.close(Duration::ZERO).await;
                expect_status(answer, StatusCode::PRECONDITION_REQUIRED)
            }
            Err(why) => Err(why),
        };
        self.check("push-without-hello-refused", Level::Must, "§5.3", without);

        // §4.2: a lower epoch is refused with the highest.
        let stale = match self.connect().await {
            Ok(mut b) => {
                let answer = self.hello(&mut b, base).await;
                b.close(Duration::ZERO).await;
                expect_stale(answer, e1)
            }
            Err(why) => Err(why),
        };
        self.check("stale-hello-refused", Level::Must, "§4.2", stale);

        // §4.4: an equal epoch on a new connection is accepted and supersedes `a`.
        let mut c = match self.connect().await {
            Ok(c) => c,
            Err(why) => {
                self.check("equal-epoch-redial", Level::Must, "§4.4", Err(why));
                return;
            }
        };
        let redial = expect_ok(self.hello(&mut c, e1).await, "hello with the same epoch");
        self.check("equal-epoch-redial", Level::Must, "§4.4", redial);
        let dropped = superseded(self, &mut a, &key, e1).await;
        self.check("older-session-dropped", Level::Must, "§4.4", dropped);

        // §5.2: a push with an epoch below the highest is refused with the highest.
        let higher = expect_ok(self.hello(&mut c, e2).await, "a second hello, higher");
        let stale_push = match higher {
            Ok(()) => expect_stale(
                self.push(&mut c, &format!("{key}-stale"), TENANT, e1).await,
                e2,
            ),
            Err(why) => Err(why),
        };
        self.check("stale-push-refused", Level::Must, "§5.2", stale_push);

        // §2: malformed requests are refused with 400.
        let malformed = self.malformed(&mut c).await;
        self.check("malformed-refused", Level::Must, "§2", malformed);

        // §5: any other path is 404.
        let request = Request::builder()
            .method(Method::GET)
            .uri(format!(
                "https://{}/posgate-conformance-no-such-path",
                self.terminal.server_name
            ))
            .body(Bytes::new())
            .expect("a valid request");
        let unknown = expect_status(self.send(&mut c, request).await, StatusCode::NOT_FOUND);
        self.check("unknown-path-404", Level::Should, "§5", unknown);

        // §6: PINGs answered: the idle connection, PINGed every 250 ms with 1 s to
        // answer, stays up.
        let ping = match tokio::time::timeout(PING_WATCH, c.ended()).await {
            Err(_) => Ok(()),
            Ok(end) => Err(format!("the idle connection ended while PINGed: {end:?}")),
        };
        self.check("ping-answered", Level::Must, "§6", ping);
        c.close(Duration::from_secs(1)).await;

        // §5: every answer came well within the time a pod waits for it.
        let (took, what) = self
            .slowest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let prompt = if took <= PROMPT {
            Ok(())
        } else {
            Err(format!(
                "the slowest answer ({what}) took {took:?}, more than {PROMPT:?}"
            ))
        };
        self.check("answered-in-time", Level::Should, "§5", prompt);
    }

    /// A push with a key of 128 characters (every visible ASCII one), a tenant of 64
    /// and a pod id of 128 is taken; one whose key differs in the last character only
    /// is another push (a terminal that cuts keys short would take it for a repeat);
    /// the first again is a duplicate.
    async fn longest_ids(&self, a: &mut Session, key: &str, epoch: Epoch) -> Result<(), String> {
        let visible = (b'!'..=b'~').map(char::from);
        let long_key: String = format!("{key}-")
            .chars()
            .chain(visible)
            .cycle()
            .take(128)
            .collect();
        let mut other_key = long_key.clone();
        other_key.pop();
        other_key.push(if long_key.ends_with('~') { '!' } else { '~' });
        // `[A-Za-z0-9._-]{1,64}` and `[A-Za-z0-9._:-]{1,128}`: the punctuation and
        // digits first, so the 64 characters hold one of each kind.
        let alnum = ('0'..='9').chain('A'..='Z').chain('a'..='z');
        let tenant: String = TENANT
            .chars()
            .chain("._-".chars())
            .chain(alnum.clone())
            .take(64)
            .collect();
        let pod: String = POD
            .chars()
            .chain(":._-".chars())
            .chain(alnum)
            .cycle()
            .take(128)
            .collect();
        let request = |key: &str| {
            let mut push = self.push_request(key, &tenant, epoch);
            let pod = HeaderValue::from_str(&pod).expect("a valid pod id");
            push.headers_mut().insert(wire::POD_HEADER, pod);
            push
        };
        taken_fresh(self.send(a, request(&long_key)).await)
            .map_err(|e| format!("a 128-character key: {e}"))?;
        taken_fresh(self.send(a, request(&other_key)).await)
            .map_err(|e| format!("a key differing from it in the last character: {e}"))?;
        duplicate(self.send(a, request(&long_key)).await)
            .map_err(|e| format!("the 128-character key again: {e}"))
    }

    /// [`AT_ONCE`] pushes with new keys sent together on `a`: each `2xx` without the
    /// marker.
    async fn at_once(&self, a: &Session, key: &str, epoch: Epoch) -> Result<(), String> {
        let pushes = (0..AT_ONCE).map(|i| {
            let request = self.push_request(&format!("{key}-at-once-{i}"), TENANT, epoch);
            let mut sender = a.sender();
            async move { self.send_on(&mut sender, request).await }
        });
        let answers = futures::future::join_all(pushes).await;
        for (i, answer) in answers.into_iter().enumerate() {
            taken_fresh(answer)
                .map_err(|e| format!("push {} of {AT_ONCE} sent at once: {e}", i + 1))?;
        }
        Ok(())
    }

    /// A hello with a non-numeric epoch, one for another terminal, and a push without
    /// an idempotency key: each `400`.
    async fn malformed(&self, c: &mut Session) -> Result<(), String> {
        let answer = self.send(c, self.hello_request("twelve")).await;
        expect_status(answer, StatusCode::BAD_REQUEST)
            .map_err(|e| format!("epoch \"twelve\": {e}"))?;
        let mut other = self.hello_request("1");
        other.headers_mut().insert(
            wire::TERMINAL_HEADER,
            http::HeaderValue::from_static("posgate-conformance-not-this-terminal"),
        );
        let answer = self.send(c, other).await;
        expect_status(answer, StatusCode::BAD_REQUEST)
            .map_err(|e| format!("another terminal's id: {e}"))?;
        let mut keyless = wire::push(&PosPush {
            terminal: &self.terminal.id,
            server_name: &self.terminal.server_name,
            path: self.push_path,
            tenant: TENANT,
            key: "k",
            epoch: 1,
            pod: self.dialer.pod(),
            content_type: None,
            body: Bytes::new(),
            queued: None,
            trace: None,
        })
        .expect("a valid push");
        keyless
            .headers_mut()
            .remove(http::header::HeaderName::from_static("idempotency-key"));
        let answer = self.send(c, keyless).await;
        expect_status(answer, StatusCode::BAD_REQUEST)
            .map_err(|e| format!("push without idempotency-key: {e}"))
    }
}

/// Every check, in the order they run and are reported: id, level, rule.
pub const ALL: [(&str, Level, &str); 18] = [
    ("tls-h2", Level::Must, "§1"),
    ("hello-accepted", Level::Must, "§4.4"),
    ("push-accepted", Level::Must, "§5.5"),
    ("duplicate-marked", Level::Must, "§5.4"),
    ("key-per-tenant", Level::Must, "§5"),
    ("push-without-content-type", Level::Must, "§2"),
    ("unknown-headers-ignored", Level::Must, "§2"),
    ("max-length-key-deduplicated", Level::Must, "§2, §5.4"),
    ("concurrent-pushes", Level::Must, "§5"),
    ("push-without-hello-refused", Level::Must, "§5.3"),
    ("stale-hello-refused", Level::Must, "§4.2"),
    ("equal-epoch-redial", Level::Must, "§4.4"),
    ("older-session-dropped", Level::Must, "§4.4"),
    ("stale-push-refused", Level::Must, "§5.2"),
    ("malformed-refused", Level::Must, "§2"),
    ("unknown-path-404", Level::Should, "§5"),
    ("ping-answered", Level::Must, "§6"),
    ("answered-in-time", Level::Should, "§5"),
];

/// The superseded session `a`: closed by the terminal within the grace, or refusing a
/// push (it may still finish requests in flight, never take new pushes as current).
async fn superseded(kit: &Kit<'_>, a: &mut Session, key: &str, epoch: Epoch) -> Result<(), String> {
    if tokio::time::timeout(SUPERSEDE_GRACE, a.ended())
        .await
        .is_ok()
    {
        return Ok(());
    }
    match kit.push(a, &format!("{key}-superseded"), TENANT, epoch).await {
        Ok((StatusCode::OK, _)) => Err(format!(
            "the older connection is still open {SUPERSEDE_GRACE:?} after a newer hello and takes pushes"
        )),
        _ => Ok(()),
    }
}

fn stale_epoch(headers: &http::HeaderMap) -> Option<Epoch> {
    headers.get(STALE_EPOCH_HEADER)?.to_str().ok()?.parse().ok()
}

fn expect_ok(answer: Result<Answer, String>, what: &str) -> Result<(), String> {
    match answer? {
        (StatusCode::OK, _) => Ok(()),
        (status, _) => Err(format!("{what} answered {status}, not 200")),
    }
}

fn expect_status(answer: Result<Answer, String>, want: StatusCode) -> Result<(), String> {
    match answer? {
        (status, _) if status == want => Ok(()),
        (status, _) => Err(format!("answered {status}, not {want}")),
    }
}

fn expect_stale(answer: Result<Answer, String>, highest: Epoch) -> Result<(), String> {
    match answer? {
        (StatusCode::CONFLICT, h) if stale_epoch(&h) == Some(highest) => Ok(()),
        (StatusCode::CONFLICT, h) => Err(format!(
            "409 with posgate-stale-epoch {:?}, not {highest}",
            h.get(STALE_EPOCH_HEADER)
        )),
        (status, _) => Err(format!(
            "answered {status}, not 409 with posgate-stale-epoch {highest}"
        )),
    }
}

/// A push taken now: `2xx` without the duplicate marker.
fn taken_fresh(answer: Result<Answer, String>) -> Result<(), String> {
    match answer? {
        (status, h) if status.is_success() && h.get(DUPLICATE_HEADER).is_none() => Ok(()),
        (status, h) if status.is_success() => Err(format!(
            "a new key answered as a duplicate ({DUPLICATE_HEADER}: {:?})",
            h.get(DUPLICATE_HEADER)
        )),
        (status, _) => Err(format!("answered {status}, not 200")),
    }
}

/// A repeated key: `2xx` with `posgate-duplicate: 1`.
fn duplicate(answer: Result<Answer, String>) -> Result<(), String> {
    match answer? {
        (status, h) if status.is_success() && h.get(DUPLICATE_HEADER).is_some_and(|v| v == "1") => {
            Ok(())
        }
        (status, _) if status.is_success() => Err(format!(
            "a repeated key was taken again ({status} without {DUPLICATE_HEADER}: 1)"
        )),
        (status, _) => Err(format!(
            "answered {status}, not 200 with {DUPLICATE_HEADER}: 1"
        )),
    }
}
