//! The API tokens file and `POSGATE_API_TOKENS` (an operator's file, but also whatever
//! an editor or a broken template leaves in it), and the `Authorization` header value:
//! never a panic; an error names a place, never the text (a token must not reach a log).
#![no_main]

use libfuzzer_sys::fuzz_target;
use posgate::credentials::ApiTokens;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for parsed in [
        ApiTokens::from_file_text(&text),
        ApiTokens::from_env_value(&text),
    ] {
        match parsed {
            Ok(tokens) => {
                let _ = format!("{tokens:?}");
            }
            Err(error) => {
                let message = error.to_string();
                assert!(message.len() < 200, "{message}");
            }
        }
    }
    if let Some(token) = ApiTokens::bearer(&text) {
        assert!(!token.is_empty() && text.contains(token));
    }
});
