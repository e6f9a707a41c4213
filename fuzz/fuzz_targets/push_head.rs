//! A push's terminal id, query and headers as any client may send them: never a panic;
//! what is accepted is what the API documents (a valid key, 1 ms..=the maximum
//! deadline, no second Content-Type).
#![no_main]

use http::Uri;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use posgate::api::valid_key;
use posgate::http::push_head;
use posgate::push::MAX_TIMEOUT;

const NAMES: [&str; 5] = [
    "idempotency-key",
    "content-encoding",
    "content-type",
    "authorization",
    "x-other",
];

#[derive(Arbitrary, Debug)]
struct Input {
    terminal: String,
    query: String,
    headers: Vec<(u8, Vec<u8>)>,
}

fuzz_target!(|input: Input| {
    let Ok(uri) = format!("/v1/terminals/x/push?{}", input.query).parse::<Uri>() else {
        return;
    };
    let headers = posgate_fuzz::headers(&NAMES, &input.headers);
    if let Ok(head) = push_head(&input.terminal, &uri, &headers) {
        assert!(valid_key(&head.key), "{:?}", head.key);
        assert!(!head.timeout.is_zero() && head.timeout <= MAX_TIMEOUT);
        assert!(headers.get_all("content-type").iter().count() <= 1);
    }
});
