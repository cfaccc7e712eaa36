//! The [`WindowStore`] operations on Redis: each one script call (see
//! `scripts`), or one per slot on a cluster (see `steps`).

use async_trait::async_trait;
use fred::prelude::{ClientLike, KeysInterface, SortedSetsInterface, Value};

use super::layout::{meter_hash, meter_member};
use super::scripts::{count, flag, int, no_windows, wait, Conversions};
use super::RedisStore;
use crate::store::{
    steps, CodeToStore, CodeTry, ConversionBlock, ConversionHit, ConversionOutcome,
    ConversionPolicy, ConversionState, DroppedCode, Escalation, ExpiringMembers, HitOutcome,
    HitRequest, Keys, LoginAttemptOutcome, LoginAttemptRequest, LoginOutcome, LoginPolicy,
    LoginRequest, LoginStateOutcome, OtpOutcome, PeekOutcome, ReserveOutcome, ReserveRequest,
    StoreError, SubjectWindows, WindowSpec, WindowStore,
};

/// How long `/readyz`'s write lives: a probe every few seconds rewrites it.
const PROBE_TTL_MS: i64 = 60_000;

#[async_trait]
impl WindowStore for RedisStore {
    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError> {
        let subject = [SubjectWindows {
            key: req.key,
            windows: req.windows,
            callers_own: false,
        }];
        let mut outcome = self
            .reserve_script(
                ReserveRequest {
                    subjects: &subject,
                    conversions: &[],
                    member: req.member,
                    gate_open: req.gate_open,
                    force: req.force,
                    code: None,
                },
                Conversions::CheckOnly,
            )
            .await?;
        outcome
            .outcomes
            .pop()
            .ok_or_else(|| StoreError::Protocol("reserve answered no subject".into()))
    }

    /// Standalone: one script for every subject and the code. A cluster keeps
    /// each subject in its own slot: one call per subject, then the code.
    async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        if self.client.is_clustered() {
            // boxed: a cluster's steps would size every call's future
            return Box::pin(steps::reserve(self, req)).await;
        }
        self.reserve_script(req, Conversions::Count).await
    }

    /// Standalone: the user, the IP and an IPv6 client's network in one
    /// script. A cluster keeps them in three slots: the network's call, the
    /// IP's, then the user's (see `steps::login`).
    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        if self.client.is_clustered() {
            // boxed: a cluster's steps would size every call's future
            return Box::pin(steps::login(self, req)).await;
        }
        let user_req = LoginAttemptRequest {
            window_key: req.window_key,
            lock_key: req.lock_key,
            policy: req.policy,
            success: req.success,
            captcha_passed: req.captcha_passed,
            captcha_demanded: false,
            ip_blocked: false,
            member: req.member,
            shadow: req.shadow,
            pair: req.pair,
        };
        let (user, ip, network) = self
            .login_script(&user_req, req.ip.as_ref(), req.network.as_ref())
            .await?;
        Ok(LoginOutcome { user, ip, network })
    }

    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError> {
        let n = windows.len();
        if n == 0 {
            return Err(no_windows());
        }
        let args = || {
            let mut args = Vec::with_capacity(1 + 3 * n);
            args.push(int(n as u64));
            for w in windows {
                args.extend([
                    int(u64::from(w.limit)),
                    int(w.window_ms),
                    flag(w.is_meter()),
                ]);
            }
            args
        };
        let meter_key = meter_hash(key, windows);
        let mut keys = vec![key];
        keys.extend(meter_key.as_deref());
        let out = self
            .eval_ints(&self.scripts.window_peek, &keys, args, 2 * n)
            .await?;
        Ok(PeekOutcome {
            counts: out[..n]
                .iter()
                .map(|c| count(*c))
                .collect::<Result<_, _>>()?,
            retry_after_ms: out[n..].iter().map(|w| wait(*w)).collect(),
        })
    }

    /// A log alone: one `ZREM`. With meters: `undo.lua`, which lowers each,
    /// in their hash or in the log (`layout`).
    async fn undo(
        &self,
        key: &str,
        member: &str,
        windows: &[WindowSpec],
    ) -> Result<(), StoreError> {
        if !windows.iter().any(WindowSpec::is_meter) {
            let client = self.client_here();
            return self
                .run_on(&client, client.zrem::<i64, _, _>(key, member))
                .await
                .map(|_| ());
        }
        // A subject with meters keeps them in a hash, or in its log.
        let meter_key = meter_hash(key, windows);
        let in_log = meter_key.is_none();
        let args = || {
            let mut args = vec![Value::from(member)];
            for w in windows.iter().filter(|w| w.is_meter()) {
                let field = if in_log {
                    meter_member(w)
                } else {
                    w.meter_field()
                };
                args.extend([Value::from(field), int(w.window_ms)]);
            }
            args
        };
        let mut keys = vec![key];
        keys.extend(meter_key.as_deref());
        let _: i64 = self.eval(&self.scripts.undo, &keys, args).await?;
        Ok(())
    }

    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError> {
        self.login_script(&req, None, None)
            .await
            .map(|(user, _, _)| user)
    }

    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        pair_lock_key: Option<&str>,
        policy: &LoginPolicy,
        shadow: bool,
    ) -> Result<LoginStateOutcome, StoreError> {
        let args = || {
            vec![
                int(policy.captcha_window_ms),
                int(policy.lock_window_ms),
                flag(shadow),
            ]
        };
        let mut keys = vec![window_key, lock_key];
        keys.extend(pair_lock_key);
        let out = self
            .eval_ints(&self.scripts.login_state, &keys, args, 4)
            .await?;
        Ok(LoginStateOutcome {
            locked_retry_after_ms: u64::try_from(out[0]).ok(),
            failures: count(out[1])?,
            lock_window_failures: count(out[2])?,
            pair_locked_retry_after_ms: u64::try_from(out[3]).ok(),
        })
    }

    /// `reserve.lua` with this conversion alone, checked only: the same
    /// code decides it on every path.
    async fn conversion_hit(
        &self,
        hit: ConversionHit<'_>,
        force: bool,
    ) -> Result<ConversionOutcome, StoreError> {
        let mut outcome = self
            .reserve_script(
                ReserveRequest {
                    subjects: &[],
                    conversions: &[hit],
                    member: "-",
                    gate_open: false,
                    force,
                    code: None,
                },
                Conversions::CheckOnly,
            )
            .await?;
        outcome
            .conversions
            .pop()
            .ok_or_else(|| StoreError::Protocol("reserve answered no conversion".into()))
    }

    async fn conversion_count(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<Option<u64>, StoreError> {
        let slice = self
            .count_conversion(key, "e", 1, -1, policy.slice_ms(), policy.keep_ms())
            .await?;
        Ok(u64::try_from(slice).ok())
    }

    async fn conversion_undo(&self, key: &str, slice: u64) -> Result<(), StoreError> {
        // The slice and window arguments matter only when adding.
        let slice = i64::try_from(slice).unwrap_or(i64::MAX);
        self.count_conversion(key, "e", -1, slice, 1, 1).await?;
        Ok(())
    }

    async fn conversion_success(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<(), StoreError> {
        self.count_conversion(key, "s", 1, -1, policy.slice_ms(), policy.keep_ms())
            .await?;
        Ok(())
    }

    async fn conversion_state(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<ConversionState, StoreError> {
        let args = || {
            vec![
                int(policy.slice_ms()),
                int(policy.slices()),
                int(u64::from(policy.min_ratio_ppm)),
                int(policy.bucket_ms().unwrap_or(0)),
            ]
        };
        let out = self
            .eval_ints(&self.scripts.conversion_peek, &[key], args, 9)
            .await?;
        let block = match u64::try_from(out[2]) {
            Ok(retry_after_ms) => Some(ConversionBlock {
                level: if out[6] == 1 {
                    Escalation::Challenge
                } else {
                    Escalation::Block
                },
                retry_after_ms,
                events: count(out[3])?,
                successes: count(out[4])?,
                shadow: out[5] == 1,
                normal_milli: wait(out[7]),
            }),
            Err(_) => None,
        };
        Ok(ConversionState {
            events: count(out[0])?,
            successes: count(out[1])?,
            normal_milli: wait(out[8]),
            block,
        })
    }

    async fn expiring_add(&self, key: &str, member: &str, ttl_ms: u64) -> Result<(), StoreError> {
        let args = || vec![Value::from(member), int(ttl_ms)];
        let _: i64 = self.eval(&self.scripts.expiring_add, &[key], args).await?;
        Ok(())
    }

    async fn expiring_remove(&self, key: &str, member: &str) -> Result<(), StoreError> {
        let client = self.client_here();
        self.run_on(&client, client.zrem::<i64, _, _>(key, member))
            .await
            .map(|_| ())
    }

    async fn expiring_members(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<ExpiringMembers, StoreError> {
        let args = || vec![int(limit.max(1) as u64)];
        let out: Vec<String> = self
            .eval(&self.scripts.expiring_members, &[key], args)
            .await?;
        let bad = || StoreError::Protocol("bad answer from expiring_members".into());
        let (total, pairs) = out.split_first().ok_or_else(bad)?;
        let members = pairs
            .chunks_exact(2)
            .map(|pair| Ok((pair[0].clone(), pair[1].parse().map_err(|_| bad())?)))
            .collect::<Result<_, StoreError>>()?;
        Ok(ExpiringMembers {
            members,
            total: total.parse().map_err(|_| bad())?,
        })
    }

    async fn otp_put(&self, code: CodeToStore<'_>, counted: bool) -> Result<(), StoreError> {
        let deadline = self.script_deadline();
        let args = || {
            vec![
                Value::from(code.mac),
                int(u64::from(code.attempts)),
                int(code.ttl_ms),
                int(u64::from(counted)),
                Value::from(code.asker),
                Value::from(deadline),
            ]
        };
        match self
            .eval::<i64>(&self.scripts.otp_put, &[code.key], args)
            .await?
        {
            1 => Ok(()),
            3 => Err(self.late()),
            v => Err(StoreError::Protocol(format!("bad answer {v} from otp_put"))),
        }
    }

    async fn otp_check(&self, code: CodeTry<'_>) -> Result<OtpOutcome, StoreError> {
        let deadline = self.script_deadline();
        let args = || {
            vec![
                Value::from(code.mac),
                int(u64::from(code.attempts)),
                int(code.ttl_ms),
                Value::from(code.client),
                Value::from(deadline),
            ]
        };
        let out = self
            .eval_ints(&self.scripts.otp_check, &[code.key], args, 3)
            .await?;
        Ok(match out[0] {
            0 => OtpOutcome::Valid {
                attempts_left: count(out[1])?,
                counted: out[2] != 0,
            },
            1 => OtpOutcome::Wrong {
                attempts_left: count(out[1])?,
            },
            2 => OtpOutcome::Burnt {
                retry_after_ms: wait(out[1]),
            },
            3 => return Err(self.late()),
            v => {
                return Err(StoreError::Protocol(format!(
                    "bad outcome {v} from otp_check"
                )))
            }
        })
    }

    async fn otp_drop(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
    ) -> Result<DroppedCode, StoreError> {
        let args = || vec![Value::from(mac), Value::from(i64::from(attempts))];
        let found: i64 = self.eval(&self.scripts.otp_drop, &[key], args).await?;
        match found {
            0 => Ok(DroppedCode::Untried),
            1 => Ok(DroppedCode::Tried),
            2 => Ok(DroppedCode::Absent),
            v => Err(StoreError::Protocol(format!(
                "bad answer {v} from otp_drop"
            ))),
        }
    }

    async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.delete_keys(keys.iter().map(|k| k.as_str().into()).collect())
            .await
    }

    async fn recent_members(
        &self,
        key: &str,
        window_ms: u64,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let args = || vec![int(window_ms), int(max as u64)];
        self.eval(&self.scripts.recent_members, &[key], args).await
    }

    async fn index_members(&self, key: &str, max: usize) -> Result<Vec<String>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let stop = i64::try_from(max - 1).unwrap_or(i64::MAX);
        self.run(
            self.client
                .zrange::<Vec<String>, _, _, _>(key, 0, stop, None, true, None, false),
        )
        .await
    }

    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        self.eval(&self.scripts.get_or_init, &[key], || {
            vec![Value::from(candidate)]
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(self.client.ping::<()>(None)).await
    }

    /// A plain `SET … PX`: a script would not do, as Redis lets one whose
    /// first command frees memory (`ZREMRANGEBYSCORE`) write past
    /// `maxmemory`. Then `readyz.lua` over keys of two hash tags (one in a
    /// Cluster), as a decision's script outside a Cluster: a user whose ACL
    /// refuses scripts (`NOPERM`), or a sharding proxy that refuses keys of
    /// several slots in one command (`CROSSSLOT`), takes the `SET` and
    /// fails every decision.
    async fn writable(&self, key: &str) -> Result<(), StoreError> {
        let expire = Some(fred::types::Expiration::PX(PROBE_TTL_MS));
        self.run(self.client.set::<(), _, _>(key, "1", expire, None, false))
            .await?;
        let [first, second] = Keys::readiness_tags(key);
        let keys: &[&str] = if self.client.is_clustered() {
            &[&first]
        } else {
            &[&first, &second]
        };
        let _: i64 = self.eval(&self.scripts.readyz, keys, Vec::new).await?;
        Ok(())
    }
}
