//! Terminal naming and addressing: ids like `pos-00042`, server names like
//! `pos-00042.pos.test`, and which listener address a terminal is dialled on.
//!
//! Terminals are not given a socket each: one listener costs one file descriptor, and a
//! process may hold only ~20,000, which must cover the connections themselves. Instead a
//! few listeners (on distinct 127.x.y.z addresses, so a dialling pod does not run out of
//! ephemeral source ports towards one destination) serve all terminals, and the TLS SNI
//! names the terminal. This module does no I/O.

use std::net::{Ipv4Addr, SocketAddr};

use serde::Serialize;

/// Width terminal numbers are zero-padded to; larger numbers simply get more digits.
const ID_DIGITS: usize = 5;

/// How terminal ids and server names are spelled.
#[derive(Debug, Clone)]
pub struct Naming {
    /// Prefix before the zero-padded number, e.g. `pos-`.
    pub prefix: String,
    /// DNS suffix of server names, e.g. `pos.test` (the certificate is `*.<domain>`).
    pub domain: String,
}

impl Naming {
    /// The terminal id of number `n`, e.g. `pos-00042`.
    pub fn id(&self, n: u64) -> String {
        format!("{}{n:0ID_DIGITS$}", self.prefix)
    }

    /// The TLS server name of terminal id `id`.
    pub fn server_name(&self, id: &str) -> String {
        format!("{id}.{}", self.domain)
    }

    /// The terminal number a server name designates, if it is spelled exactly as
    /// [`Naming::server_name`] spells it (so `pos-42` and `pos-000042` do not alias
    /// `pos-00042`).
    pub fn number_of_server_name(&self, server_name: &str) -> Option<u64> {
        let id = server_name
            .strip_suffix(self.domain.as_str())?
            .strip_suffix('.')?;
        self.number_of_id(id)
    }

    /// The terminal number of a canonical id.
    pub fn number_of_id(&self, id: &str) -> Option<u64> {
        let digits = id.strip_prefix(self.prefix.as_str())?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = digits.parse().ok()?;
        (self.id(n) == id).then_some(n)
    }
}

/// The listener addresses: `count` consecutive IPv4 addresses from `first_ip`.
pub fn listener_ips(first_ip: Ipv4Addr, count: usize) -> Vec<Ipv4Addr> {
    let base = u32::from(first_ip);
    (0..count as u32)
        .map(|k| Ipv4Addr::from(base.wrapping_add(k)))
        .collect()
}

/// Which listener serves terminal number `n`: round-robin, so each listener address sees
/// `terminals / listeners` connections from a pod.
pub fn listener_index(n: u64, listeners: usize) -> usize {
    (n % listeners as u64) as usize
}

/// Where a terminal is reached: what a pod's terminal directory needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TerminalInfo {
    /// Terminal id, e.g. `pos-00042`.
    pub id: String,
    /// Address to dial.
    pub addr: SocketAddr,
    /// TLS server name (SNI) to send and verify.
    pub server_name: String,
}

/// `terminals.csv`: header `id,addr,server_name`, one terminal a line. Ids, addresses and
/// server names contain no commas or quotes, so no quoting is needed.
pub fn terminals_csv(terminals: &[TerminalInfo]) -> String {
    let mut out = String::from("id,addr,server_name\n");
    for t in terminals {
        out.push_str(&format!("{},{},{}\n", t.id, t.addr, t.server_name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming() -> Naming {
        Naming {
            prefix: "pos-".into(),
            domain: "pos.test".into(),
        }
    }

    #[test]
    fn ids_round_trip_and_reject_aliases() {
        let n = naming();
        assert_eq!(n.id(42), "pos-00042");
        assert_eq!(n.id(1_234_567), "pos-1234567");
        assert_eq!(n.number_of_server_name("pos-00042.pos.test"), Some(42));
        assert_eq!(
            n.number_of_server_name("pos-1234567.pos.test"),
            Some(1_234_567)
        );
        assert_eq!(n.number_of_server_name("pos-42.pos.test"), None);
        assert_eq!(n.number_of_server_name("pos-000042.pos.test"), None);
        assert_eq!(n.number_of_server_name("pos-00042.other.test"), None);
        assert_eq!(n.number_of_server_name("pos-00042pos.test"), None);
        assert_eq!(n.number_of_server_name("pos-+0042.pos.test"), None);
    }

    #[test]
    fn listeners_are_consecutive_and_round_robin() {
        let ips = listener_ips(Ipv4Addr::new(127, 0, 1, 255), 3);
        assert_eq!(ips[1], Ipv4Addr::new(127, 0, 2, 0));
        assert_eq!(listener_index(7, 3), 1);
    }
}
