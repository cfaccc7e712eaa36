//! The descriptor budget: `RLIMIT_NOFILE`, raised to its hard limit at
//! start-up, shared out as
//!
//! 1. a reserve for what the service opens itself, whatever its clients do:
//!    [`FIXED_RESERVE`] (standard streams, listeners, the audit database
//!    pools, SMTP, the spool and journal files, template and config watches)
//!    plus, per thread ([`threads`]), its runtime's descriptors and one Redis
//!    connection per Redis node;
//! 2. the admin listener's cap, when `server.admin_bind` is set;
//! 3. the public listener's cap, each of its connections counted twice: a
//!    request may open a connection of its own to the SMS or captcha
//!    provider while it runs.
//!
//! Explicit caps must fit the same sums; a cap that does not fails start-up
//! naming its key. Deciding is pure ([`ConnectionPlan::derive`]); reading and
//! raising the limit is [`DescriptorLimit::raise`].

use crate::settings::{ServerSettings, Settings, SettingsError, StoreBackend};

/// Descriptors kept whatever the thread count (see the module doc).
pub const FIXED_RESERVE: u64 = 64;
/// Per thread: its runtime's epoll and waker descriptors.
pub const PER_THREAD: u64 = 2;
/// The admin listener's default cap: a sixteenth of what is left after the
/// reserve, within these bounds (a few operators and a metrics scraper).
const ADMIN_DEFAULT: (u64, u64) = (4, 64);
/// The admin listener's per-address default: half its cap, so that one
/// peer leaves the other half to admins elsewhere, but at least this many
/// (a browser opens six to a host), or the whole cap when it is smaller.
const ADMIN_PER_IP_FLOOR: u64 = 8;
/// The per-address default: an eighth of the public cap (eight addresses
/// fill the listener, never one), within these bounds; 256 leaves room for
/// a backend's connection pool.
const PER_IP_DEFAULT: (u64, u64) = (1, 256);
/// A soft limit of "unlimited" is read as the kernel's default `nr_open`.
const UNLIMITED_AS: u64 = 1 << 20;

/// The process's descriptor limit, as found and as raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// The soft limit the process started with.
    pub started: u64,
    /// The soft limit now in force: the hard one, when raising worked.
    pub soft: u64,
    /// The hard limit (systemd's `LimitNOFILE=`, `ulimit -Hn`).
    pub hard: u64,
}

impl DescriptorLimit {
    /// Raise the soft limit to the hard one, as servers commonly do (the
    /// soft limit's usual 1024 is for programs that use `select`); when that
    /// fails, go on with the soft limit and say why.
    pub fn raise() -> std::io::Result<Self> {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given, which lives here.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // `rlim_t` is u64 on 64-bit Linux but not on every target.
        #[allow(clippy::useless_conversion)]
        let as_count = |value: libc::rlim_t| {
            if value == libc::RLIM_INFINITY {
                UNLIMITED_AS
            } else {
                u64::from(value)
            }
        };
        let (started, hard) = (as_count(limit.rlim_cur), as_count(limit.rlim_max));
        let mut soft = started;
        if hard > started {
            let raised = libc::rlimit {
                rlim_cur: hard as libc::rlim_t,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit only reads the struct it is given.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                soft = hard;
            } else {
                let error = std::io::Error::last_os_error();
                tracing::warn!(soft = started, hard, %error, "descriptor limit not raised");
            }
        }
        Ok(Self {
            started,
            soft,
            hard,
        })
    }
}

/// One listener's cap, as actix applies it: `per_worker` connections on
/// each of `workers` threads, so `workers × per_worker` at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerCap {
    /// Worker threads: `server.workers` or one per CPU, fewer when the cap
    /// is smaller.
    pub workers: usize,
    /// Connections each worker may hold (actix's `max_connections`).
    pub per_worker: usize,
}

impl ListenerCap {
    /// `cap` over at most `workers` threads (fewer when the cap is smaller),
    /// rounded down to a multiple of the worker count: never above `cap`.
    pub fn split(cap: u64, workers: usize) -> Self {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX).max(1);
        let workers = workers.clamp(1, cap);
        Self {
            workers,
            per_worker: cap / workers,
        }
    }

    /// The most connections the listener holds.
    pub fn total(&self) -> u64 {
        (self.workers * self.per_worker) as u64
    }
}

/// The caps start-up applies, and what they were derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionPlan {
    /// Descriptors kept for the service itself.
    pub reserved: u64,
    /// The public listener's cap (`server.max_connections`, or derived).
    pub public: ListenerCap,
    /// Absent without `server.admin_bind`.
    pub admin: Option<ListenerCap>,
    /// Connections per client address on the public listener
    /// (`server.max_connections_per_ip`, or derived from the public cap).
    pub per_ip: u64,
    /// Connections per client address on the admin listener
    /// (`server.admin_max_connections_per_ip`, or derived from its cap):
    /// one peer that reaches it (a runaway scraper, a host taken over) must
    /// not hold every slot. Absent without it.
    pub admin_per_ip: Option<u64>,
}

/// Threads that hold descriptors of their own: the workers of each listener
/// and of the main runtime (one per CPU each), and each listener's accept
/// thread.
pub fn threads(cpus: usize, admin_listener: bool) -> u64 {
    let listeners = 1 + u64::from(admin_listener);
    (listeners + 1) * cpus as u64 + listeners
}

/// Redis connections per thread: one per node named in `store.redis_url`
/// (a cluster opens one per node), none with the in-process store.
pub fn redis_nodes(settings: &Settings) -> u64 {
    if settings.store.backend == StoreBackend::Memory {
        return 0;
    }
    let url = settings.store.redis_url.expose();
    match url.split_once("://") {
        Some((scheme, rest)) if scheme.ends_with("-cluster") => {
            let hosts = rest.split(['/', '?']).next().unwrap_or(rest);
            hosts.split(',').count() as u64
        }
        _ => 1,
    }
}

impl ConnectionPlan {
    /// The caps for `settings` under a soft descriptor limit of `limit` on
    /// a machine of `cpus`: the configured ones when they fit, derived
    /// ones where unset; each listener's workers are `server.workers`, or
    /// one per CPU.
    pub fn derive(settings: &Settings, limit: u64, cpus: usize) -> Result<Self, SettingsError> {
        let server = &settings.server;
        let workers = server.workers.map_or(cpus, |n| n as usize);
        let admin_listener = server.admin_bind.is_some();
        // The main runtime keeps one thread per CPU whatever the workers.
        let reserved = FIXED_RESERVE
            + threads(cpus.max(workers), admin_listener) * (PER_THREAD + redis_nodes(settings));
        let Some(available) = limit.checked_sub(reserved).filter(|left| *left >= 4) else {
            // Workers beyond the CPUs are what took the room: say so.
            let (key, remedy) = if workers > cpus {
                (
                    "server.workers",
                    "raise LimitNOFILE or lower server.workers",
                )
            } else {
                ("server.max_connections", "raise LimitNOFILE")
            };
            return Err(SettingsError::invalid(
                key,
                format!(
                    "no room for connections: the descriptor limit (RLIMIT_NOFILE) is {limit} \
                     and tollgate keeps {reserved} for itself; {remedy}"
                ),
            ));
        };
        let admin = match (admin_listener, server.admin_max_connections) {
            (false, _) => 0,
            (true, None) => (available / 16).clamp(ADMIN_DEFAULT.0, ADMIN_DEFAULT.1),
            (true, Some(cap)) => {
                let most = available - 2;
                if u64::from(cap) > most {
                    return Err(too_many(
                        "server.admin_max_connections",
                        cap,
                        most,
                        limit,
                        reserved,
                    ));
                }
                cap.into()
            }
        };
        let room = (available - admin) / 2;
        let public = match server.max_connections {
            None => room,
            Some(cap) if u64::from(cap) > room => {
                return Err(too_many(
                    "server.max_connections",
                    cap,
                    room,
                    limit,
                    reserved + admin,
                ))
            }
            Some(cap) => cap.into(),
        };
        let per_ip = per_ip(server, public)?;
        let admin = admin_listener.then(|| ListenerCap::split(admin, workers));
        let admin_per_ip = admin
            .map(|cap| admin_per_ip(server, cap.total()))
            .transpose()?;
        Ok(Self {
            reserved,
            public: ListenerCap::split(public, workers),
            admin,
            per_ip,
            admin_per_ip,
        })
    }
}

fn per_ip(server: &ServerSettings, public: u64) -> Result<u64, SettingsError> {
    match server.max_connections_per_ip {
        None => Ok((public / 8).clamp(PER_IP_DEFAULT.0, PER_IP_DEFAULT.1)),
        Some(cap) if u64::from(cap) > public => Err(SettingsError::invalid(
            "server.max_connections_per_ip",
            format!("{cap} is above the public listener's cap of {public} connections"),
        )),
        Some(cap) => Ok(cap.into()),
    }
}

fn admin_per_ip(server: &ServerSettings, admin: u64) -> Result<u64, SettingsError> {
    match server.admin_max_connections_per_ip {
        None => Ok((admin / 2).max(ADMIN_PER_IP_FLOOR.min(admin)).max(1)),
        Some(cap) if u64::from(cap) > admin => Err(SettingsError::invalid(
            "server.admin_max_connections_per_ip",
            format!("{cap} is above the admin listener's cap of {admin} connections"),
        )),
        Some(cap) => Ok(cap.into()),
    }
}

fn too_many(key: &str, cap: u32, most: u64, limit: u64, kept: u64) -> SettingsError {
    SettingsError::invalid(
        key,
        format!(
            "{cap} does not fit the descriptor limit (RLIMIT_NOFILE {limit}, of which {kept} \
             are kept for the service and the other listener; a public connection counts \
             twice, for the provider call it may make): at most {most}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(configure: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = Settings::defaults().unwrap();
        configure(&mut s);
        s
    }

    fn with_admin(s: &mut Settings) {
        s.server.admin_bind = Some("127.0.0.1:0".parse().unwrap());
    }

    #[test]
    fn the_defaults_under_256_descriptors_on_two_cpus() {
        // Memory store, admin listener: threads = 3 × 2 + 2 = 8, reserved =
        // 64 + 8 × 2 = 80, left 176; admin 176 / 16 = 11; public (176 − 11)
        // / 2 = 82, per address 82 / 8 = 10.
        let plan = ConnectionPlan::derive(&settings(with_admin), 256, 2).unwrap();
        assert_eq!(
            plan,
            ConnectionPlan {
                reserved: 80,
                public: ListenerCap {
                    workers: 2,
                    per_worker: 41
                },
                admin: Some(ListenerCap {
                    workers: 2,
                    per_worker: 5
                }),
                per_ip: 10,
                admin_per_ip: Some(8),
            }
        );
    }

    #[test]
    fn the_unit_s_65536_on_sixteen_cpus_with_a_redis_cluster() {
        let s = settings(|s| {
            with_admin(s);
            s.store.backend = StoreBackend::Redis;
            s.store.redis_url = crate::settings::SecretUrl::new("redis-cluster://a:1,b:2,c:3");
        });
        // threads = 3 × 16 + 2 = 50; reserved = 64 + 50 × (2 + 3) = 314.
        let plan = ConnectionPlan::derive(&s, 65536, 16).unwrap();
        assert_eq!(plan.reserved, 314);
        assert_eq!(plan.admin.unwrap().total(), 64);
        assert_eq!(plan.admin_per_ip, Some(32));
        // (65536 − 314 − 64) / 2 = 32579, 16 workers × 2036.
        assert_eq!(plan.public.total(), 32576);
        assert_eq!(plan.per_ip, 256);
    }

    #[test]
    fn without_an_admin_listener_nothing_is_set_aside_for_it() {
        // threads = 2 × 2 + 1 = 5, reserved 74, left 182, public 91.
        let plan = ConnectionPlan::derive(&settings(|_| {}), 256, 2).unwrap();
        assert_eq!(
            (plan.reserved, plan.admin, plan.admin_per_ip),
            (74, None, None)
        );
        assert_eq!(plan.public.total(), 90);
        assert_eq!(plan.per_ip, 11);
    }

    #[test]
    fn explicit_caps_that_fit_are_kept() {
        let s = settings(|s| {
            with_admin(s);
            s.server.max_connections = Some(50);
            s.server.admin_max_connections = Some(3);
            s.server.max_connections_per_ip = Some(7);
        });
        let mut with_admin_per_ip = s.clone();
        with_admin_per_ip.server.admin_max_connections = Some(20);
        with_admin_per_ip.server.admin_max_connections_per_ip = Some(3);
        let plan = ConnectionPlan::derive(&with_admin_per_ip, 256, 2).unwrap();
        assert_eq!(plan.admin_per_ip, Some(3));
        let plan = ConnectionPlan::derive(&s, 256, 2).unwrap();
        assert_eq!(plan.public, ListenerCap::split(50, 2));
        assert_eq!(plan.admin, Some(ListenerCap::split(3, 2)));
        assert_eq!(plan.per_ip, 7);
        // Three split over two workers hold two, all of which one address
        // may hold: fewer than a browser opens.
        assert_eq!(plan.admin_per_ip, Some(2));
    }

    #[test]
    fn configured_workers_split_the_caps_and_never_shrink_the_reserve() {
        let s = settings(|s| {
            with_admin(s);
            s.server.workers = Some(1);
        });
        let one = ConnectionPlan::derive(&s, 256, 2).unwrap();
        let per_cpu = ConnectionPlan::derive(&settings(with_admin), 256, 2).unwrap();
        assert_eq!(
            one.reserved, per_cpu.reserved,
            "the main runtime still has two"
        );
        assert_eq!(
            (one.public, one.admin),
            (
                ListenerCap {
                    workers: 1,
                    per_worker: 82
                },
                Some(ListenerCap {
                    workers: 1,
                    per_worker: 11
                })
            ),
            "one worker holds each listener's whole cap"
        );
        let s = settings(|s| s.server.workers = Some(4));
        let four = ConnectionPlan::derive(&s, 256, 2).unwrap();
        // threads = 2 × 4 + 1 = 9, reserved 64 + 9 × 2 = 82, left 174, public 87.
        assert_eq!(four.reserved, 82);
        assert_eq!(four.public, ListenerCap::split(87, 4));
        // 2 × 100 + 1 threads take 466 of 256: the workers are named.
        let s = settings(|s| s.server.workers = Some(100));
        let error = ConnectionPlan::derive(&s, 256, 2).unwrap_err().to_string();
        assert!(
            error.starts_with("invalid setting `server.workers`: no room for connections")
                && error.ends_with("lower server.workers"),
            "{error}"
        );
    }

    #[test]
    fn caps_that_do_not_fit_name_their_key() {
        type Case = (&'static str, fn(&mut Settings), u64, &'static str);
        let cases: [Case; 5] = [
            (
                "public above its room",
                |s| s.server.max_connections = Some(1000),
                256,
                "invalid setting `server.max_connections`: 1000 does not fit the descriptor \
                 limit (RLIMIT_NOFILE 256, of which 74 are kept",
            ),
            (
                "admin above what is left",
                |s| {
                    with_admin(s);
                    s.server.admin_max_connections = Some(500);
                },
                256,
                "invalid setting `server.admin_max_connections`: 500 does not fit",
            ),
            (
                "per address above the derived public cap",
                |s| s.server.max_connections_per_ip = Some(200),
                256,
                "invalid setting `server.max_connections_per_ip`: 200 is above the public \
                 listener's cap of 91 connections",
            ),
            (
                "admin per address above the admin cap",
                |s| {
                    with_admin(s);
                    s.server.admin_max_connections = Some(6);
                    s.server.admin_max_connections_per_ip = Some(7);
                },
                256,
                "invalid setting `server.admin_max_connections_per_ip`: 7 is above the admin \
                 listener's cap of 6 connections",
            ),
            (
                "a limit below the reserve",
                |_| {},
                60,
                "invalid setting `server.max_connections`: no room for connections: the \
                 descriptor limit (RLIMIT_NOFILE) is 60 and tollgate keeps 74 for itself",
            ),
        ];
        for (case, configure, limit, expected) in cases {
            let error = ConnectionPlan::derive(&settings(configure), limit, 2)
                .unwrap_err()
                .to_string();
            assert!(error.starts_with(expected), "{case}: {error}");
        }
    }

    #[test]
    fn a_cap_below_the_cpu_count_gets_fewer_workers_never_more_connections() {
        assert_eq!(
            ListenerCap::split(3, 8),
            ListenerCap {
                workers: 3,
                per_worker: 1
            }
        );
        assert_eq!(ListenerCap::split(11, 2).total(), 10);
        assert_eq!(ListenerCap::split(0, 2).total(), 1);
    }

    #[test]
    fn redis_nodes_count_the_cluster_s_hosts() {
        let nodes = |backend, url: &str| {
            redis_nodes(&settings(|s| {
                s.store.backend = backend;
                s.store.redis_url = crate::settings::SecretUrl::new(url);
            }))
        };
        assert_eq!(nodes(StoreBackend::Memory, "redis://a:1"), 0);
        assert_eq!(nodes(StoreBackend::Redis, "rediss://:pw@a:1/0"), 1);
        assert_eq!(nodes(StoreBackend::Redis, "redis-cluster://a:1,b:2"), 2);
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let limit = DescriptorLimit::raise().unwrap();
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.started <= limit.soft);
    }
}
