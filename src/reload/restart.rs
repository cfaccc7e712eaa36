//! What a reload cannot apply: the sections a running service built its
//! listeners, stores, audit trail and mailer from, and the SMS settings
//! those were built with. The file may change them; they take effect at the
//! next start, and each reload until then says which are waiting.

use crate::settings::Settings;

/// The settings that differ between the running service's (`running`, as
/// it started) and the file's (`read`) and need a restart, as a config
/// file spells them.
pub fn pending(running: &Settings, read: &Settings) -> Vec<&'static str> {
    // The email templates are reloaded with the SMS ones.
    let mailer = |settings: &Settings| crate::settings::EmailSettings {
        templates_dir: None,
        ..settings.email.clone()
    };
    let changed = [
        ("[server]", running.server != read.server),
        ("[store]", running.store != read.store),
        ("[audit]", running.audit != read.audit),
        ("[email]", mailer(running) != mailer(read)),
        ("[admin]", running.admin != read.admin),
        // The refresh task's period; the entries are reloaded.
        (
            "lists.refresh_interval",
            running.lists.refresh_interval != read.lists.refresh_interval,
        ),
        // The code HMAC's key and the subject hashes' (store::keys).
        (
            "sms.code_secret",
            running.sms.code_secret != read.sms.code_secret,
        ),
        // The audit rollups' phone ranges.
        (
            "sms.prefix_digits",
            running.sms.prefix_digits != read.sms.prefix_digits,
        ),
        // Every IPv6 network subject's name (reload::restart_only_kept).
        (
            "sms.network_bits",
            running.sms.network_bits != read.sms.network_bits,
        ),
    ];
    changed
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Secret;

    #[test]
    fn the_same_settings_wait_for_nothing() {
        let settings = Settings::defaults().unwrap();
        assert!(pending(&settings, &settings.clone()).is_empty());
    }

    #[test]
    fn decision_settings_apply_without_a_restart() {
        let running = Settings::defaults().unwrap();
        let mut read = running.clone();
        read.sms.max_verify_attempts += 1;
        read.login.lock_after += 1;
        read.sms.provider.url = "http://127.0.0.1:9/sms".to_string().into();
        read.email.templates_dir = Some("/etc/tollgate/email".into());
        read.lists.allow_phones = vec!["+8613800138000".into()];
        assert!(pending(&running, &read).is_empty());
    }

    #[test]
    fn sections_built_at_start_up_and_secrets_wait_for_a_restart() {
        let running = Settings::defaults().unwrap();
        let mut read = running.clone();
        read.server.api_keys = vec![Secret::new("a-new-key-0123456789")];
        read.sms.code_secret = Secret::new("another-secret-0123456789");
        read.audit.batch_size += 1;
        read.lists.refresh_interval *= 2;
        read.sms.network_bits = 56;
        assert_eq!(
            pending(&running, &read),
            [
                "[server]",
                "[audit]",
                "lists.refresh_interval",
                "sms.code_secret",
                "sms.network_bits"
            ]
        );
    }
}
