//! A TCP proxy in front of a real server (Redis, PostgreSQL) that a test can cut and restore, as
//! when the network to that server fails for a while and comes back.
//!
//! While cut, every open connection through it is closed and new ones are accepted and closed at
//! once (the port stays taken, so clients reconnect to the same address after the restore). It
//! is never a mock: whatever passes through reaches the real server unchanged.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A cuttable proxy; it stops when dropped.
#[derive(Debug)]
pub struct CuttableProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl CuttableProxy {
    /// Listen on a free local port, forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: impl Into<String>) -> std::io::Result<CuttableProxy> {
        let upstream = upstream.into();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (open, _) = watch::channel(true);
        let task = tokio::spawn(accept(listener, upstream, open.clone()));
        Ok(CuttableProxy { addr, open, task })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` replaced by the proxy's (`redis://127.0.0.1:6379/0` →
    /// `redis://127.0.0.1:PROXY/0`). The URL must name `host:port` after `scheme://[userinfo@]`.
    pub fn url_through(&self, url: &str) -> String {
        let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let userinfo = authority.rsplit_once('@').map(|(user, _)| format!("{user}@")).unwrap_or_default();
        format!("{scheme}://{userinfo}{}{tail}", self.addr)
    }

    /// Close every connection and refuse new ones until [`CuttableProxy::restore`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Forward again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: String, open: watch::Sender<bool>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else { continue };
        if !*open.borrow() {
            drop(inbound);
            continue;
        }
        tokio::spawn(forward(inbound, upstream.clone(), open.subscribe()));
    }
}

/// Copy both ways until either side closes or the proxy is cut.
async fn forward(mut inbound: TcpStream, upstream: String, mut open: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = open.wait_for(|open| !*open) => {}
    }
}

/// `host:port` of a `scheme://[userinfo@]host:port/…` URL (what a proxy in front of that server
/// forwards to).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    authority.rsplit_once('@').map_or(authority, |(_, host)| host).to_owned()
}
