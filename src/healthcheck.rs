//! `tollgate healthcheck`: asks a running server's `/healthz` (or `/readyz`)
//! and succeeds on 200 only. A container image's `HEALTHCHECK` runs it, so
//! the image needs no curl; it is a plain HTTP/1.1 GET on loopback, as the
//! probes are never behind TLS.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest status line and headers read before giving up on finding the
/// status line: a probe answers with a few dozen bytes.
const MOST_HEAD_BYTES: usize = 4096;

/// The listeners a probe asks, in turn, until one answers 200: readiness
/// the public one (`bind`), which is what serves; liveness the admin one
/// as well when there is one. A flood that fills one listener's
/// connections (its cap is there to hold) must not get the process
/// restarted, and the other listener with it: the process is live while
/// either answers.
pub fn listeners_to_ask(
    bind: SocketAddr,
    admin_bind: Option<SocketAddr>,
    ready: bool,
) -> Vec<SocketAddr> {
    match admin_bind {
        Some(admin) if !ready => vec![admin, bind],
        _ => vec![bind],
    }
}

/// Where a server listening on `bind` is reached from its own host: an
/// unspecified address (`0.0.0.0`, `::`, as in a container) on loopback.
pub fn local_address(bind: SocketAddr) -> anyhow::Result<SocketAddr> {
    if bind.port() == 0 {
        bail!("server.bind {bind} has no fixed port: pass --address");
    }
    let ip = match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, bind.port()))
}

/// [`probe`] each of `addresses` in turn, `timeout` shared among them (a
/// container runtime bounds the whole check): the first 200's status line,
/// or every failure, joined.
pub async fn probe_any(
    addresses: &[SocketAddr],
    path: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let share = timeout / u32::try_from(addresses.len().max(1)).unwrap_or(u32::MAX);
    let mut failures = Vec::new();
    for &address in addresses {
        match probe(address, path, share).await {
            Ok(status) => return Ok(status),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    bail!("{}", failures.join("; "))
}

/// GET `path` from `address` within `timeout`: the status line on 200, an
/// error naming the address and what it answered otherwise.
pub async fn probe(address: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<String> {
    tokio::time::timeout(timeout, get(address, path))
        .await
        .map_err(|_| {
            anyhow!(
                "no answer from http://{address}{path} within {}",
                humantime::format_duration(timeout)
            )
        })?
}

async fn get(address: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(address)
        .await
        .with_context(|| format!("cannot connect to http://{address}{path}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: tollgate-healthcheck\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < MOST_HEAD_BYTES {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let status_line = text.lines().next().unwrap_or_default().trim().to_string();
    match status_line.split_whitespace().nth(1) {
        Some("200") => Ok(status_line),
        _ => bail!("http://{address}{path} answered {status_line:?}"),
    }
}
