//! What the fuzz targets share: headers built from fuzz input.

use http::{HeaderMap, HeaderName, HeaderValue};

/// A header map of `pairs`, each a name picked from `names` by its index byte (so the
/// fuzzer reaches the headers a parser reads, repeated or not) and the bytes of its
/// value; a value HTTP cannot carry is left out.
pub fn headers(names: &[&'static str], pairs: &[(u8, Vec<u8>)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let name = HeaderName::from_static(names[*name as usize % names.len()]);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }
    headers
}
