//! The cluster secret: the shared key pods sign their requests to each other with
//! (`crate::peer::signing`). Its bytes never leave this type except into the MAC.
//!
//! Not for: signing or checking requests (`crate::peer`).

use std::fmt;
use std::sync::Arc;

/// Minimum length of a cluster secret, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// The shared secret pods sign their requests to each other with. `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

/// Why bytes cannot be a [`ClusterSecret`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cluster secret must be at least {MIN_SECRET_LEN} bytes, got {0}")]
pub struct SecretTooShort(pub usize);

impl ClusterSecret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretTooShort> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort(bytes.len()));
        }
        Ok(ClusterSecret(bytes.into()))
    }

    /// Whether both hold the same bytes (constant time).
    pub fn same_as(&self, other: &ClusterSecret) -> bool {
        use subtle::ConstantTimeEq;
        self.0.len() == other.0.len() && bool::from(self.0.ct_eq(&other.0))
    }

    /// The secret itself, for the MAC that signs peer requests (`crate::peer`).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_redacted_and_must_be_long_enough() {
        let s = ClusterSecret::new(*b"super-secret-value-1234").unwrap();
        assert!(!format!("{s:?}").contains("super"));
        assert_eq!(
            ClusterSecret::new(*b"short").unwrap_err(),
            SecretTooShort(5)
        );
    }
}
