//! `HttpServer::on_connect`: each accepted connection of a listener is
//! admitted by its address (public listener) and given its clock and
//! watchdog, kept in the connection's extensions until it closes.

use std::any::Any;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Extensions;
use metrics::{counter, gauge, Counter, Gauge};
use socket2::SockRef;

use super::per_ip::{Admission, PerIp};
use super::watchdog::{close_now, Connection};
use super::Listener;
use crate::metrics::{CONNECTIONS_OPEN, CONNECTIONS_REFUSED, CONNECTIONS_STALLED};

/// What one listener does with each connection it accepts.
pub struct ListenerHook {
    request_timeout: Duration,
    per_ip: Option<Arc<PerIp>>,
    open: Gauge,
    refused: Counter,
    stalled: Counter,
}

impl ListenerHook {
    /// `per_ip`: the listener's per-address count (`per_ip`), none when
    /// every peer is a proxy.
    pub fn new(listener: Listener, request_timeout: Duration, per_ip: Option<Arc<PerIp>>) -> Self {
        let name = listener.as_str();
        Self {
            request_timeout,
            per_ip,
            open: gauge!(CONNECTIONS_OPEN, "listener" => name),
            refused: counter!(CONNECTIONS_REFUSED, "listener" => name, "reason" => "per_ip"),
            stalled: counter!(CONNECTIONS_STALLED, "listener" => name),
        }
    }

    /// Called by actix with the accepted stream, before its first byte is read.
    pub fn on_connect(&self, io: &dyn Any, extensions: &mut Extensions) {
        let Some(stream) = io.downcast_ref::<tokio::net::TcpStream>() else {
            // Only plain TCP listeners are built (startup); anything else
            // would go unbounded, so say so loudly.
            tracing::error!("connection of an unknown kind: no request timeout applies to it");
            return;
        };
        // A peer already gone has nothing to bound.
        let Ok(peer) = stream.peer_addr() else {
            return;
        };
        let slot = match self.per_ip.as_ref().map(|per_ip| per_ip.admit(peer.ip())) {
            None | Some(Admission::Trusted) => None,
            Some(Admission::Counted(slot)) => Some(slot),
            Some(Admission::Refused) => {
                // Closed before a byte is read: the descriptor is free at
                // once, whatever pace the client would have sent a request at.
                self.refused.increment(1);
                close_now(SockRef::from(stream));
                return;
            }
        };
        extensions.insert(Connection::start(
            stream.as_raw_fd(),
            peer,
            self.request_timeout,
            slot,
            self.open.clone(),
            self.stalled.clone(),
        ));
    }
}
