//! In-flight push slots: at most `--max-inflight` pushes per pod, and at most
//! `--max-inflight-per-tenant` of them for one tenant, so one tenant's flood (or one
//! tenant's slow terminals) cannot take every slot from the others. A push past either
//! bound is answered `503 overloaded` at once; only the tenant at its share sees it.
//!
//! Not for: the per-terminal waiting bound (`owner`), or anything across pods: each pod
//! counts what it handles itself (received or forwarded to it).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a push got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The pod is at `--max-inflight`.
    Pod,
    /// The push's tenant is at `--max-inflight-per-tenant`.
    Tenant,
}

impl Full {
    /// What the `503 overloaded` says.
    pub fn message(self) -> &'static str {
        match self {
            Full::Pod => "this pod is at its in-flight push limit",
            Full::Tenant => "this tenant is at its share of the pod's in-flight pushes",
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Slots {
    pod: Arc<Semaphore>,
    per_tenant: usize,
    /// Slots held per tenant; a tenant with none has no entry, so the map holds only
    /// the tenants with pushes in flight. The name is shared with their slots.
    held: Held,
}

/// Keyed by tenant names from the server's own token file, so a fast hash (foldhash)
/// rather than SipHash, which only keys chosen by callers need.
type Held = Arc<Mutex<foldhash::HashMap<Arc<str>, usize>>>;

/// One push's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _pod: OwnedSemaphorePermit,
    tenant: Arc<str>,
    held: Held,
}

impl Slots {
    pub fn new(max: usize, per_tenant: usize) -> Slots {
        Slots {
            pod: Arc::new(Semaphore::new(max.max(1))),
            per_tenant: per_tenant.max(1),
            held: Arc::default(),
        }
    }

    /// A slot for a push of `tenant`, or which bound it is past.
    pub fn admit(&self, tenant: &str) -> Result<Slot, Full> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = held.get(tenant).copied().unwrap_or(0);
        if mine >= self.per_tenant {
            return Err(Full::Tenant);
        }
        let permit = self
            .pod
            .clone()
            .try_acquire_owned()
            .map_err(|_| Full::Pod)?;
        // A tenant's name is copied only when it has no push in flight; its slots
        // share that copy.
        let name = match held.get_key_value(tenant) {
            Some((name, _)) => name.clone(),
            None => Arc::from(tenant),
        };
        *held.entry(name.clone()).or_insert(0) += 1;
        Ok(Slot {
            _pod: permit,
            tenant: name,
            held: self.held.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_share_is_refused_and_the_others_are_not() {
        let slots = Slots::new(4, 2);
        let a1 = slots.admit("acme").unwrap();
        let _a2 = slots.admit("acme").unwrap();
        assert_eq!(slots.admit("acme").unwrap_err(), Full::Tenant);
        let _b1 = slots.admit("bank").unwrap();
        let _b2 = slots.admit("bank").unwrap();
        // The pod is full now: every tenant is refused, for the pod's reason.
        assert_eq!(slots.admit("shop").unwrap_err(), Full::Pod);
        drop(a1);
        let _a3 = slots.admit("acme").unwrap();
        assert_eq!(slots.admit("acme").unwrap_err(), Full::Tenant);
    }

    #[test]
    fn tenants_without_pushes_in_flight_are_forgotten() {
        let slots = Slots::new(10, 5);
        let held: Vec<Slot> = (0..5)
            .map(|i| slots.admit(&format!("t{i}")).unwrap())
            .collect();
        assert_eq!(slots.held.lock().unwrap().len(), 5);
        drop(held);
        assert!(slots.held.lock().unwrap().is_empty());
    }
}
