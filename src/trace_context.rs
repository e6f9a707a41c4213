//! The W3C trace context of a push (`traceparent`, `tracestate`:
//! <https://www.w3.org/TR/trace-context/>) and the request id of an API request: what
//! lets one push be followed from the sender through the entry pod and the owner to the
//! terminal, in logs and in traces.
//!
//! The entry pod takes the caller's `traceparent` (or, when there is none or it is
//! malformed, starts a trace if it exports spans: a trace nobody collects would only
//! cost every hop its headers) and gives every request a [`RequestId`],
//! answered in [`REQUEST_ID`]. A forwarded push carries both to the owner: the trace in
//! `posgate-*` headers, which the peer signature covers like every `posgate-*` header,
//! the request id in the peer request's own id (`crate::peer::signing::sign`); the owner
//! sends the terminal `traceparent`/`tracestate` as optional headers, which terminals
//! ignore unless they trace (`docs/pos-protocol.md` section 2).
//!
//! Not for: exporting spans (`crate::telemetry`) or deciding what is logged.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};
use rand::Rng;

/// The caller's trace context, on the public API and towards terminals.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// Vendor data of the trace, passed on unchanged.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// The answer header naming the request: in every answer, and in the pods' log lines of
/// that request.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// [`TRACEPARENT`] on a forwarded push.
pub const PEER_TRACEPARENT: HeaderName = HeaderName::from_static("posgate-traceparent");
/// [`TRACESTATE`] on a forwarded push.
pub const PEER_TRACESTATE: HeaderName = HeaderName::from_static("posgate-tracestate");

/// The W3C limit a vendor may rely on; a longer `tracestate` is dropped, not cut.
const MAX_TRACESTATE: usize = 512;

/// One API request, for grepping logs: 16 lowercase hex digits, random.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

impl RequestId {
    pub fn new() -> Self {
        RequestId(rand::rng().random_range(1..=u64::MAX))
    }

    /// A request id as [`fmt::Display`] writes it; `None` for anything else.
    pub fn parse(text: &[u8]) -> Option<Self> {
        (text.len() == 16)
            .then(|| lower_hex(text))
            .flatten()
            .map(|v| RequestId(v as u64))
    }

    /// The id's bits, most significant first: what [`fmt::Display`] writes as hex.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub fn header_value(self) -> HeaderValue {
        let mut digits = [0; 16];
        hex_into(&mut digits, u128::from(self.0));
        HeaderValue::from_bytes(&digits).expect("hex digits are a header value")
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a push is in its request's trace: for the log lines of the pods it passes and
/// the `traceparent` the terminal gets.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The API request that carried the push: the entry pod's id, on the owner too.
    pub request_id: RequestId,
    /// This pod's span of the push, the parent of the next hop's; `None` when nobody
    /// traces: the caller sent no `traceparent` and this pod exports no spans, so a
    /// trace would reach no one and cost every hop its headers. Boxed: a push's futures
    /// hold its trace and are copied when moved, untraced pushes too.
    pub context: Option<Box<TraceContext>>,
}

impl Trace {
    /// The entry pod's trace of a request with `headers`, given the id `request_id`:
    /// under the caller's span, or a new trace if this pod exports spans (`start`).
    pub fn entry(request_id: Option<RequestId>, headers: &HeaderMap, start: bool) -> Self {
        let caller = TraceContext::from_headers(headers, &TRACEPARENT, &TRACESTATE);
        Trace {
            request_id: request_id.unwrap_or_default(),
            context: TraceContext::under(caller, start),
        }
    }

    /// This trace one hop further (the forward of a push, its send to the terminal).
    pub fn hop(&self) -> Self {
        Trace {
            request_id: self.request_id,
            context: self.context.as_ref().map(|c| Box::new(c.child())),
        }
    }

    /// Sets the peer headers of a forward: this trace's span (the forward's,
    /// [`Trace::hop`]) as the parent of the owner's. The request id goes in the
    /// signature's (`crate::peer::signing::sign`).
    pub fn insert_peer(&self, headers: &mut HeaderMap) {
        if let Some(context) = &self.context {
            context.insert(headers, PEER_TRACEPARENT, PEER_TRACESTATE);
        }
    }

    /// The owner's trace of a forward with `headers` that serves the entry pod's
    /// `request_id` (`crate::peer::signing::serves`): a span under its forward. A pod
    /// of an earlier release sends none: then a new trace if this pod exports spans
    /// (`start`).
    pub fn from_peer(request_id: Option<RequestId>, headers: &HeaderMap, start: bool) -> Self {
        let context = TraceContext::from_headers(headers, &PEER_TRACEPARENT, &PEER_TRACESTATE);
        Trace {
            request_id: request_id.unwrap_or_default(),
            context: TraceContext::under(context, start),
        }
    }
}

/// A position in a trace: the trace, the span a next hop hangs under, and the flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// The span of the hop that sends this context (`parent-id` of `traceparent`).
    pub span_id: u64,
    /// The span this one hangs under, when this pod made it ([`TraceContext::child`]);
    /// `None` for a trace's root and for a context read from headers.
    pub parent_id: Option<u64>,
    /// `trace-flags`; bit 0 is "sampled".
    pub flags: u8,
    pub state: Option<HeaderValue>,
}

impl TraceContext {
    /// A new trace, sampled, this hop its root.
    pub fn start() -> Self {
        let mut rng = rand::rng();
        TraceContext {
            trace_id: rng.random_range(1..=u128::MAX),
            span_id: rng.random_range(1..=u64::MAX),
            parent_id: None,
            flags: 1,
            state: None,
        }
    }

    /// The context in `headers` under `parent` and `state` (the public names or the
    /// peer ones); `None` when `parent` is absent, repeated or malformed.
    pub fn from_headers(
        headers: &HeaderMap,
        parent: &HeaderName,
        state: &HeaderName,
    ) -> Option<Self> {
        let mut values = headers.get_all(parent).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return None;
        };
        let (trace_id, span_id, flags) = parse_traceparent(value.as_bytes())?;
        // A repeated tracestate is one list split over lines; one line is all we keep.
        let mut states = headers.get_all(state).iter();
        let state = match (states.next(), states.next()) {
            (Some(s), None) if !s.is_empty() && s.len() <= MAX_TRACESTATE => Some(s.clone()),
            _ => None,
        };
        Some(TraceContext {
            trace_id,
            span_id,
            parent_id: None,
            flags,
            state,
        })
    }

    /// This pod's span under `sender`'s, or, without one, a new trace if `start`.
    fn under(sender: Option<Self>, start: bool) -> Option<Box<Self>> {
        sender
            .map(|c| c.child())
            .or_else(|| start.then(TraceContext::start))
            .map(Box::new)
    }

    /// The same trace one hop further: a new span of this pod's under this one.
    pub fn child(&self) -> Self {
        TraceContext {
            span_id: rand::rng().random_range(1..=u64::MAX),
            parent_id: Some(self.span_id),
            ..self.clone()
        }
    }

    /// Sets the context on `headers` under `parent` and `state`, as HPACK literals never
    /// indexed: they differ on every push (`crate::pos::wire` says why that matters).
    pub fn insert(&self, headers: &mut HeaderMap, parent: HeaderName, state: HeaderName) {
        let mut value =
            HeaderValue::from_bytes(&self.traceparent()).expect("hex is a header value");
        value.set_sensitive(true);
        headers.insert(parent, value);
        if let Some(s) = &self.state {
            headers.insert(state, s.clone());
        }
    }

    /// Whether the trace is sampled (`trace-flags` bit 0): only sampled spans are
    /// exported.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` value, without an allocation: every forward and every push
    /// to a terminal writes one.
    pub fn traceparent(&self) -> [u8; 55] {
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex_into(&mut out[3..35], self.trace_id);
        hex_into(&mut out[36..52], u128::from(self.span_id));
        hex_into(&mut out[53..55], u128::from(self.flags));
        out
    }

    /// The trace id as logs and trace backends show it.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// `version-trace_id-parent_id-flags`. Version `00` is exactly 55 characters; a later
/// version may append fields after a `-`, which are ignored (W3C "versioning"); `ff`
/// and all-zero ids are invalid.
fn parse_traceparent(v: &[u8]) -> Option<(u128, u64, u8)> {
    if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
        return None;
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' || v[..2] == *b"ff" {
        return None;
    }
    lower_hex(&v[..2])?;
    let trace_id = lower_hex(&v[3..35])?;
    let span_id = lower_hex(&v[36..52])? as u64;
    let flags = lower_hex(&v[53..55])? as u8;
    (trace_id != 0 && span_id != 0).then_some((trace_id, span_id, flags))
}

/// `value`'s lowest `out.len()` hex digits, lowercase, into `out`.
fn hex_into(out: &mut [u8], mut value: u128) {
    for digit in out.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(value & 0xf) as usize];
        value >>= 4;
    }
}

/// Lowercase hex digits (at most 32) as a number.
fn lower_hex(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |acc, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u128::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn parsed(traceparent: &str) -> Option<TraceContext> {
        TraceContext::from_headers(
            &headers(&[(&TRACEPARENT, traceparent)]),
            &TRACEPARENT,
            &TRACESTATE,
        )
    }

    #[test]
    fn the_w3c_example_round_trips() {
        let c = parsed(EXAMPLE).expect("valid");
        assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id, 0x00f0_67aa_0ba9_02b7);
        assert_eq!(c.flags, 1);
        assert_eq!(&c.traceparent()[..], EXAMPLE.as_bytes());
        let child = c.child();
        assert_eq!((child.trace_id, child.flags), (c.trace_id, c.flags));
        assert_ne!(child.span_id, c.span_id);
    }

    #[test]
    fn malformed_or_repeated_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parsed(bad), None, "{bad:?}");
        }
        // A later version may carry more fields; the first four are read.
        let future =
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert_eq!(parsed(future).map(|c| c.flags), Some(1));
        let twice = headers(&[(&TRACEPARENT, EXAMPLE), (&TRACEPARENT, EXAMPLE)]);
        assert_eq!(
            TraceContext::from_headers(&twice, &TRACEPARENT, &TRACESTATE),
            None
        );
    }

    #[test]
    fn tracestate_is_kept_within_its_limit_and_travels_with_the_parent() {
        let h = headers(&[(&TRACEPARENT, EXAMPLE), (&TRACESTATE, "congo=t61rcWkgMzE")]);
        let c = TraceContext::from_headers(&h, &TRACEPARENT, &TRACESTATE).unwrap();
        let mut out = HeaderMap::new();
        c.insert(&mut out, PEER_TRACEPARENT, PEER_TRACESTATE);
        assert_eq!(
            TraceContext::from_headers(&out, &PEER_TRACEPARENT, &PEER_TRACESTATE),
            Some(c)
        );
        assert!(out[&PEER_TRACEPARENT].is_sensitive(), "never indexed");
        let long = "k=".to_string() + &"v".repeat(MAX_TRACESTATE);
        let h = headers(&[(&TRACEPARENT, EXAMPLE), (&TRACESTATE, &long)]);
        assert_eq!(
            TraceContext::from_headers(&h, &TRACEPARENT, &TRACESTATE)
                .unwrap()
                .state,
            None
        );
    }

    #[test]
    fn a_forward_carries_a_span_under_the_entry_pods() {
        let traced = headers(&[(&TRACEPARENT, EXAMPLE)]);
        let entry = Trace::entry(Some(RequestId::new()), &traced, false);
        let entry_span = entry.context.clone().expect("the caller traces");
        assert_eq!(
            entry_span.parent_id,
            Some(0x00f0_67aa_0ba9_02b7),
            "under the caller's"
        );
        let forward = entry.hop();
        let mut sent = HeaderMap::new();
        forward.insert_peer(&mut sent);
        let owner = Trace::from_peer(Some(entry.request_id), &sent, false);
        assert_eq!(owner.request_id, entry.request_id);
        let owner_span = owner.context.expect("the trace went along");
        assert_eq!(owner_span.trace_id, entry_span.trace_id);
        assert_eq!(owner_span.parent_id, forward.context.map(|c| c.span_id));
        // A pod of an earlier release forwards without a trace: a new one only if this
        // pod exports spans.
        let own = RequestId::new();
        let legacy = Trace::from_peer(Some(own), &HeaderMap::new(), false);
        assert_eq!((legacy.request_id, legacy.context), (own, None));
        let started = Trace::from_peer(Some(own), &HeaderMap::new(), true)
            .context
            .unwrap();
        assert_eq!(started.parent_id, None);
        // Nobody traces: no trace, and no header goes to the owner.
        let untraced = Trace::entry(None, &HeaderMap::new(), false);
        assert_eq!(untraced.context, None);
        let mut sent = HeaderMap::new();
        untraced.hop().insert_peer(&mut sent);
        assert!(sent.is_empty());
        assert!(Trace::entry(None, &HeaderMap::new(), true)
            .context
            .is_some());
    }

    #[test]
    fn request_ids_print_and_parse_back() {
        let id = RequestId::new();
        let text = id.to_string();
        assert_eq!(text.len(), 16);
        assert_eq!(id.header_value(), text.as_str());
        assert_eq!(RequestId::parse(text.as_bytes()), Some(id));
        assert_eq!(hex::encode(id.to_bytes()), text);
        assert_eq!(RequestId::parse(b"xyz"), None);
        assert_eq!(RequestId::parse(b"00F067AA0BA902B7"), None);
    }
}
