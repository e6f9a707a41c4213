//! Who a `/v1` request speaks for, as the bearer-token middleware (`push.rs`) found it,
//! and what that allows: a tenant's token reaches the terminals its patterns match,
//! an operator's token the cluster view, a directory token the directory entries of the
//! terminals its patterns match. Every refusal is `403 forbidden`, decided
//! before a terminal is looked up, so a token cannot learn which ids outside its scope
//! exist.
//!
//! Not for: reading tokens (`crate::credentials`), peer requests (`internal.rs`).

use crate::credentials::{Grant, Scope, Tenant, DIRECTORY, OPERATOR};
use crate::push::answer::{Answer, ErrorCode};

/// The tenant of requests when the API runs without tokens (`--insecure`).
pub const INSECURE_TENANT: &str = "default";

/// See the module docs.
#[derive(Clone, Debug)]
pub(super) enum Caller {
    /// No tokens are configured (`--insecure`): everything, as [`INSECURE_TENANT`].
    Insecure,
    Granted(Grant),
}

impl Caller {
    /// The tenant a request about `terminal` (a push, a lookup) speaks for.
    pub(super) fn tenant_for(&self, terminal: &str) -> Result<Tenant, Answer> {
        match self {
            Caller::Insecure => Ok(Tenant(INSECURE_TENANT.to_string())),
            Caller::Granted(Grant::Tenant { tenant, scope }) if scope.allows(terminal) => {
                Ok(tenant.clone())
            }
            Caller::Granted(Grant::Tenant { .. }) => Err(forbidden(
                "this token's terminal patterns do not match this terminal",
            )),
            Caller::Granted(Grant::Operator) => Err(forbidden(
                "an operator token sees the cluster; it does not push or look up terminals",
            )),
            Caller::Granted(Grant::Directory { .. }) => Err(no_pushes()),
        }
    }

    /// The tenant a request about no one terminal (the outcome feed) speaks for.
    pub(super) fn tenant(&self) -> Result<Tenant, Answer> {
        match self {
            Caller::Insecure => Ok(Tenant(INSECURE_TENANT.to_string())),
            Caller::Granted(Grant::Tenant { tenant, .. }) => Ok(tenant.clone()),
            Caller::Granted(Grant::Operator) => Err(forbidden(
                "an operator token sees the cluster; it has no pushes of its own",
            )),
            Caller::Granted(Grant::Directory { .. }) => Err(no_pushes()),
        }
    }

    /// The terminals whose directory entries the request may change: `Err` unless the
    /// caller has the directory role (or the API runs without tokens).
    /// The tenant a broadcast is sent as, and the terminals it may reach; whether the
    /// caller is [`Caller::Insecure`] (no tokens: every tenant may broadcast).
    pub(super) fn broadcaster(&self) -> Result<(Tenant, Scope, bool), Answer> {
        match self {
            Caller::Insecure => Ok((self.tenant()?, Scope::All, true)),
            Caller::Granted(Grant::Tenant { tenant, scope }) => {
                Ok((tenant.clone(), scope.clone(), false))
            }
            Caller::Granted(_) => Err(self.tenant().expect_err("not a tenant")),
        }
    }

    pub(super) fn directory(&self) -> Result<&Scope, Answer> {
        match self {
            Caller::Insecure => Ok(&Scope::All),
            Caller::Granted(Grant::Directory { scope }) => Ok(scope),
            Caller::Granted(_) => Err(forbidden(format!(
                "changing the directory needs a directory token (tenant {DIRECTORY} in the \
                 tokens file)"
            ))),
        }
    }

    /// `Ok` when the request may see the whole cluster (`/v1/cluster`).
    pub(super) fn operator(&self) -> Result<(), Answer> {
        match self {
            Caller::Insecure | Caller::Granted(Grant::Operator) => Ok(()),
            Caller::Granted(Grant::Tenant { .. } | Grant::Directory { .. }) => {
                Err(forbidden(format!(
                "the cluster view needs an operator token (tenant {OPERATOR} in the tokens file)"
            )))
            }
        }
    }
}

fn no_pushes() -> Answer {
    forbidden("a directory token changes the directory; it does not push or look up pushes")
}

fn forbidden(message: impl Into<String>) -> Answer {
    Answer::error(ErrorCode::Forbidden, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::Scope;

    #[test]
    fn grants_reach_what_they_name() {
        let scoped = Caller::Granted(Grant::Tenant {
            tenant: Tenant("acme".into()),
            scope: Scope::Matching(vec![glob::Pattern::new("acme-*").unwrap()]),
        });
        assert_eq!(scoped.tenant_for("acme-1").unwrap(), Tenant("acme".into()));
        let refused = scoped.tenant_for("bank-1").unwrap_err();
        assert_eq!(refused.status, http::StatusCode::FORBIDDEN);
        assert!(scoped.operator().is_err());
        let operator = Caller::Granted(Grant::Operator);
        assert!(operator.operator().is_ok());
        assert!(operator.tenant_for("acme-1").is_err());
        assert!(Caller::Insecure.operator().is_ok());
        assert!(scoped.directory().is_err() && operator.directory().is_err());
        let directory = Caller::Granted(Grant::Directory { scope: Scope::All });
        assert_eq!(directory.directory().unwrap(), &Scope::All);
        assert!(directory.tenant_for("acme-1").is_err() && directory.tenant().is_err());
        assert!(directory.operator().is_err());
        assert_eq!(
            Caller::Insecure.tenant_for("any").unwrap(),
            Tenant(INSECURE_TENANT.into())
        );
    }
}
