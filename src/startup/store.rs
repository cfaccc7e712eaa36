//! The store `[store]` configures: Redis or the in-process one, behind the
//! fallback `store.on_error` names, and the key namer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::settings::{OnStoreError, Settings, StoreBackend};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::resilient::{Fallback, ResilientStore};
use crate::store::{Clock, Keys, WindowStore};

const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The stores a running service uses.
pub(super) struct Stores {
    /// What the guards call: the primary behind its fallback.
    pub store: Arc<dyn WindowStore>,
    /// The configured store alone, for readiness.
    pub primary: Arc<dyn WindowStore>,
    /// The Redis client, when the store is Redis (each worker connects its own).
    pub redis: Option<Arc<RedisStore>>,
}

/// Open the store; each in-process one is swept by a task pushed to
/// `background`.
pub(super) async fn open(
    settings: &Settings,
    clock: Arc<dyn Clock>,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Stores> {
    let mut sweep = |store: Arc<MemoryStore>| {
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                store.sweep();
            }
        }));
    };

    // Checked at start-up to fit in a usize (`settings::validate`).
    let memory_limit = usize::try_from(settings.store.memory_limit).unwrap_or(usize::MAX);
    let in_process = || Arc::new(MemoryStore::with_limit(clock.clone(), memory_limit));
    let mut redis = None;
    let primary: Arc<dyn WindowStore> = match settings.store.backend {
        StoreBackend::Memory => {
            let memory = in_process();
            sweep(memory.clone());
            memory
        }
        StoreBackend::Redis => {
            let store = Arc::new(
                RedisStore::connect(settings.store.redis_url.expose(), settings.store.timeout)
                    .await
                    .context("cannot set up the Redis client")?,
            );
            redis = Some(store.clone());
            store
        }
    };
    let fallback = match settings.store.on_error {
        OnStoreError::Deny => Fallback::Deny,
        OnStoreError::Allow => {
            let codes = in_process();
            sweep(codes.clone());
            Fallback::Allow(codes)
        }
        OnStoreError::Local => {
            let local = in_process();
            sweep(local.clone());
            Fallback::Local(local)
        }
    };
    let store: Arc<dyn WindowStore> = Arc::new(ResilientStore::new(primary.clone(), fallback));

    Ok(Stores {
        store,
        primary,
        redis,
    })
}

/// The key namer `[store]` asks for: ids in clear, or hashed.
pub(super) fn keys(settings: &Settings) -> Keys {
    let prefix = settings.store.key_prefix.clone();
    if settings.store.hash_subject_ids {
        Keys::hashed(
            prefix,
            &settings.store.subject_hash_key(&settings.sms.code_secret),
        )
    } else {
        Keys::new(prefix)
    }
}
