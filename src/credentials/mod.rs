//! The secrets a running pod uses, replaceable without a restart (`crate::reload`): the
//! API bearer tokens (`tokens`) and the cluster secret peers sign with (`secret`).
//!
//! A restart would cost a rebalance, so rotations happen in place. A new cluster secret
//! is used for signing at once, and the previous one stays accepted until the next
//! rotation, so pods reloading a few seconds apart keep talking to each other. Whether
//! a pod runs with authentication is fixed at start: a reload can change the values but
//! not turn `--insecure` mode on or off.
//!
//! Not for: reading files (`crate::config`) or checking requests (`crate::http`,
//! `crate::peer`).

use std::sync::{Arc, PoisonError, RwLock};

mod secret;
mod tokens;

pub use self::secret::{ClusterSecret, SecretTooShort, MIN_SECRET_LEN};
pub use self::tokens::{
    operator_token, ApiTokens, Grant, Scope, Tenant, TokensError, DIRECTORY, MIN_TOKEN_LEN,
    OPERATOR,
};

#[derive(Debug)]
struct State {
    tokens: Option<ApiTokens>,
    secret: Option<ClusterSecret>,
    previous: Option<ClusterSecret>,
}

/// Shared by every part of one pod that authenticates; cheap to clone.
#[derive(Clone, Debug)]
pub struct Credentials {
    state: Arc<RwLock<State>>,
}

/// A reload that would turn authentication on or off (it names what): refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the pod started without {0} (--insecure); restart it to turn authentication on or off")]
pub struct ModeChanged(pub &'static str);

impl Credentials {
    /// `None` values are insecure mode for that kind.
    pub fn new(tokens: Option<ApiTokens>, secret: Option<ClusterSecret>) -> Self {
        Credentials {
            state: Arc::new(RwLock::new(State {
                tokens,
                secret,
                previous: None,
            })),
        }
    }

    /// Like [`Credentials::new`], with `previous` still accepted (mid-rotation).
    pub fn rotating(
        tokens: Option<ApiTokens>,
        secret: Option<ClusterSecret>,
        previous: Option<ClusterSecret>,
    ) -> Self {
        let c = Credentials::new(tokens, secret);
        c.state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .previous = previous;
        c
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Writers replace whole fields; a poisoned lock still holds consistent values.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// `None` in insecure mode; otherwise what `token` may do, if it is known.
    pub fn grant_of(&self, token: Option<&str>) -> Option<Option<Grant>> {
        let state = self.read();
        let tokens = state.tokens.as_ref()?;
        Some(token.and_then(|t| tokens.grant_of(t)))
    }

    /// The secret to sign peer requests with (`None`: insecure mode).
    pub fn signing_secret(&self) -> Option<ClusterSecret> {
        self.read().secret.clone()
    }

    /// Secrets a peer request may be signed with, current first (`None`: insecure).
    pub fn accepted_secrets(&self) -> Option<Vec<ClusterSecret>> {
        let state = self.read();
        let current = state.secret.clone()?;
        Some(
            std::iter::once(current)
                .chain(state.previous.clone())
                .collect(),
        )
    }

    /// Replaces the tokens and the cluster secret; the replaced secret stays accepted.
    pub fn reload(
        &self,
        tokens: Option<ApiTokens>,
        secret: Option<ClusterSecret>,
    ) -> Result<(), ModeChanged> {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.tokens.is_some() != tokens.is_some() {
            return Err(ModeChanged("API tokens"));
        }
        if state.secret.is_some() != secret.is_some() {
            return Err(ModeChanged("a cluster secret"));
        }
        state.tokens = tokens;
        if let Some(new) = secret {
            if state.secret.as_ref().is_some_and(|old| !old.same_as(&new)) {
                state.previous = state.secret.replace(new);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> ClusterSecret {
        ClusterSecret::new(vec![b; 20]).unwrap()
    }

    #[test]
    fn rotation_keeps_the_previous_secret_and_swaps_tokens() {
        let tokens = |t: &str| Some(ApiTokens::from_env_value(&format!("acme:{t}")).unwrap());
        let c = Credentials::new(tokens("token-one-0123456789"), Some(secret(1)));
        assert!(c.grant_of(Some("token-one-0123456789")).unwrap().is_some());
        c.reload(tokens("token-two-0123456789"), Some(secret(2)))
            .unwrap();
        assert!(c.grant_of(Some("token-one-0123456789")).unwrap().is_none());
        assert!(c.grant_of(Some("token-two-0123456789")).unwrap().is_some());
        assert!(c.signing_secret().unwrap().same_as(&secret(2)));
        let accepted = c.accepted_secrets().unwrap();
        assert_eq!(accepted.len(), 2);
        assert!(accepted[1].same_as(&secret(1)));
        // Reloading the same secret again keeps the previous one (no rotation).
        c.reload(tokens("token-two-0123456789"), Some(secret(2)))
            .unwrap();
        assert_eq!(c.accepted_secrets().unwrap().len(), 2);
        // The mode is fixed at start.
        assert_eq!(
            c.reload(None, Some(secret(3))),
            Err(ModeChanged("API tokens"))
        );
        let open = Credentials::new(None, None);
        assert_eq!(open.grant_of(Some("x")), None);
        assert!(open.accepted_secrets().is_none());
    }
}
