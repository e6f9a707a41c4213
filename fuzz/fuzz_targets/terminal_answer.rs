//! What a terminal (or anything answering at its address) sends back to a hello or a
//! push: any status and headers. Never a panic; a 2xx is accepted, a 409 carrying the
//! stale-epoch header is stale, everything else refused with its status.
#![no_main]

use http::StatusCode;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use posgate::pos::wire::{receipt, verdict, Verdict};

const NAMES: [&str; 3] = ["posgate-stale-epoch", "posgate-duplicate", "x-other"];

#[derive(Arbitrary, Debug)]
struct Input {
    status: u16,
    headers: Vec<(u8, Vec<u8>)>,
}

fuzz_target!(|input: Input| {
    let Ok(status) = StatusCode::from_u16(input.status) else {
        return;
    };
    let headers = posgate_fuzz::headers(&NAMES, &input.headers);
    match verdict(status, &headers) {
        Verdict::Accepted => assert!(status.is_success()),
        Verdict::Stale { .. } => assert_eq!(status, StatusCode::CONFLICT),
        Verdict::Refused { status: s } => assert!(s == status && !status.is_success()),
    }
    let _ = receipt(&headers);
});
