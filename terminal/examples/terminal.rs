//! A whole POS terminal on `posgate-terminal`: serves the protocol on an address with a
//! certificate, prints each push it takes, and keeps nothing across a restart.
//!
//! ```sh
//! cargo run -p posgate-terminal --example terminal -- pos-00042 127.0.0.1:8443 cert.pem key.pem [pods-ca.pem]
//! ```

use std::{future::Future, sync::Arc};

use anyhow::Context;
use posgate_terminal::{tls_config, Config, DedupWindow, Push, Refusal, Server, Terminal};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

#[allow(dead_code)] // posgate's conformance test runs `run` and not `main`.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("posgate_terminal=debug")
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    run(&args, tokio::signal::ctrl_c()).await
}

/// Serves terminal `ID` on `ADDR` until `shutdown`.
pub async fn run(args: &[String], shutdown: impl Future) -> anyhow::Result<()> {
    let [id, addr, cert, key, rest @ ..] = args else {
        anyhow::bail!("usage: terminal ID ADDR CERT.pem KEY.pem [PODS-CA.pem]");
    };
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key).context("the key file")?;
    // With the pods' CA, only pods with a client certificate it signed may connect (§1).
    let pods_ca = match rest.first() {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)? {
                roots.add(cert?)?;
            }
            Some(roots)
        }
        None => None,
    };
    let tls = Arc::new(tls_config(chain, key, pods_ca)?);

    // What the till does with a push: here, print it. Return a Refusal to decline one.
    let handler = |push: Push| async move {
        let body = String::from_utf8_lossy(&push.body);
        println!(
            "push {} from {}: {body}",
            push.head.dedup_key(),
            push.head.pod
        );
        Ok::<(), Refusal>(())
    };
    let terminal = Terminal::new(id.as_str(), DedupWindow::default());
    let server = Server::new(terminal, Config::default(), handler, ());
    let listener = tokio::net::TcpListener::bind(addr.as_str()).await?;
    println!("terminal {id} listening on {}", listener.local_addr()?);
    server.run(listener, tls, shutdown).await;
    Ok(())
}
