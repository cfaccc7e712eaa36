//! The SMS provider a reload may make again: only when `[sms.provider]`
//! changed (a new client drops the old one's open connections), and never
//! from a real provider to `log`, which would write every code to the log
//! while `/sms/send` still answers 200: a `[sms.provider]` table left out of
//! an edited file looks exactly like that.

use std::sync::Arc;

use parking_lot::Mutex;

use super::ReloadError;
use crate::delivery::{build_sender, SenderCell, SmsSender};
use crate::settings::{SmsProviderKind, SmsProviderSettings};

/// The provider in force and the settings it was made from.
#[derive(Clone)]
pub struct SenderSlot {
    cell: Arc<SenderCell>,
    made_from: Arc<Mutex<SmsProviderSettings>>,
}

/// A provider made from new settings, to be put in force with the rest of
/// a reload.
pub(super) struct Remade {
    sender: Arc<dyn SmsSender>,
    settings: SmsProviderSettings,
}

impl SenderSlot {
    /// `cell` holds the provider made from `made_from`.
    pub fn new(cell: Arc<SenderCell>, made_from: SmsProviderSettings) -> Self {
        Self {
            cell,
            made_from: Arc::new(Mutex::new(made_from)),
        }
    }

    /// The provider `wanted` makes; `None` when it is the one in force.
    pub(super) fn remake(
        &self,
        wanted: &SmsProviderSettings,
    ) -> Result<Option<Remade>, ReloadError> {
        let in_force = self.made_from.lock().clone();
        if in_force == *wanted {
            return Ok(None);
        }
        if wanted.kind == SmsProviderKind::Log && in_force.kind != SmsProviderKind::Log {
            return Err(ReloadError::ToLogProvider);
        }
        Ok(Some(Remade {
            sender: build_sender(wanted)?,
            settings: wanted.clone(),
        }))
    }

    /// Put `remade` in force; sends under way finish with the old one.
    pub(super) fn put(&self, remade: Remade) {
        self.cell.replace(remade.sender);
        *self.made_from.lock() = remade.settings;
    }
}
