//! SMS and email texts per locale, rendered with minijinja. The files in
//! `templates/` are compiled in; `sms.templates_dir` and `email.templates_dir`
//! lay an operator's files over them (see [`dir`]). Templates are plain text
//! (`.txt`: no HTML escaping); an undefined variable is an error, not an empty
//! string.
//!
//! - `sms/<locale>.txt`: variables `code`, `ttl_minutes`, `ttl_secs`.
//! - `email/<locale>/<kind>.txt`: a `subject` block and a `body` block.
//!
//! Every template is parsed and rendered with sample variables when loaded
//! (start-up and reload), so a typo is an error naming the file and line then,
//! not a failed send later.

mod compiled;
mod dir;
mod plain;
mod vars;

use std::collections::BTreeMap;
use std::path::PathBuf;

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use plain::PlainSms;

pub(crate) use dir::skipped as skipped_template_name;
pub use dir::TemplateLoadError;
pub(crate) use dir::MAX_TEMPLATE_BYTES;

use crate::domain::locale;
use crate::settings::Settings;

const FALLBACK: &str = "en";

/// The emails tollgate sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EmailKind {
    /// To the account's owner, once per lock.
    LockNotice,
    /// To the admins, at most once per `email.alert_interval`.
    AlertDigest,
}

impl EmailKind {
    /// Every kind, so a loader can match a file name against each.
    pub const ALL: [EmailKind; 2] = [EmailKind::LockNotice, EmailKind::AlertDigest];

    /// The template's file name without `.txt`; also the `kind` of log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            EmailKind::LockNotice => "lock_notice",
            EmailKind::AlertDigest => "alert_digest",
        }
    }
}

/// Which text a template is: the key its locales are listed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Text {
    Sms,
    Email(EmailKind),
}

impl Text {
    fn name(self, locale: &str) -> String {
        match self {
            Text::Sms => format!("sms/{locale}.txt"),
            Text::Email(kind) => format!("email/{locale}/{}.txt", kind.as_str()),
        }
    }
}

/// One template's source and where it came from, for error messages.
struct Source {
    text: Text,
    locale: String,
    body: String,
    origin: PathBuf,
}

/// A template failed to render after it loaded (a variable it reads holds a
/// value the sample did not, for instance).
#[derive(Debug, thiserror::Error)]
#[error("template {name}: {source:#}")]
pub struct TemplateError {
    name: String,
    #[source]
    source: minijinja::Error,
}

/// Where the operator's templates are (`sms.templates_dir`,
/// `email.templates_dir`); `None` keeps the compiled-in ones alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateDirs {
    /// `sms.templates_dir`: the `<locale>.txt` files.
    pub sms: Option<PathBuf>,
    /// `email.templates_dir`: the `<locale>/<kind>.txt` files.
    pub email: Option<PathBuf>,
}

impl TemplateDirs {
    /// The directories `settings` names.
    pub fn of(settings: &Settings) -> Self {
        Self {
            sms: settings.sms.templates_dir.clone(),
            email: settings.email.templates_dir.clone(),
        }
    }
}

/// Every text tollgate can send, checked, with the locales each has.
pub struct Templates {
    env: Environment<'static>,
    /// The locales each text has, in file-name spelling.
    locales: BTreeMap<Text, Vec<String>>,
    /// The SMS texts that have a plain form, by template name.
    plain: BTreeMap<String, PlainSms>,
}

impl Templates {
    /// The compiled-in templates only.
    pub fn compiled() -> Self {
        Self::load(&TemplateDirs::default())
            .unwrap_or_else(|e| panic!("the compiled-in templates are checked by tests: {e}"))
    }

    /// The compiled-in templates with the files of `dirs` laid over them: a
    /// file replaces the compiled-in text of the same locale, a new file name
    /// adds a locale. Every template is parsed and rendered once with sample
    /// variables; the first that fails is the error.
    pub fn load(dirs: &TemplateDirs) -> Result<Self, TemplateLoadError> {
        // Keyed by the locale's canonical spelling: a file for a built-in
        // locale spelled otherwise (`zh-cn.txt`) replaces it under the
        // built-in spelling, where it once stood beside it unused.
        let mut sources: BTreeMap<String, Source> = BTreeMap::new();
        let mut add = |mut source: Source| {
            let key = source.text.name(&locale::canonical(&source.locale));
            if let Some(earlier) = sources.get(&key) {
                source.locale.clone_from(&earlier.locale);
            }
            sources.insert(key, source);
        };
        compiled::sources().for_each(&mut add);
        if let Some(path) = &dirs.sms {
            dir::sms_sources(path)?.into_iter().for_each(&mut add);
        }
        if let Some(path) = &dirs.email {
            dir::email_sources(path)?.into_iter().for_each(&mut add);
        }

        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        let mut locales: BTreeMap<Text, Vec<String>> = BTreeMap::new();
        for source in sources.values() {
            env.add_template_owned(source.text.name(&source.locale), source.body.clone())
                .map_err(|e| TemplateLoadError::template(&source.origin, &source.body, &e))?;
            locales
                .entry(source.text)
                .or_default()
                .push(source.locale.clone());
        }
        let mut templates = Self {
            env,
            locales,
            plain: BTreeMap::new(),
        };
        for source in sources.values() {
            templates.check(source)?;
        }
        templates.plain = sources
            .values()
            .filter(|source| source.text == Text::Sms)
            .filter_map(|source| {
                Some((
                    source.text.name(&source.locale),
                    PlainSms::parse(&source.body)?,
                ))
            })
            .filter(|(name, plain)| {
                let sample = vars::sms();
                templates.render_named(name, &sample).ok() == Some(plain.render(&sample))
            })
            .collect();
        Ok(templates)
    }

    /// Render `source` with sample variables, as a send would; an SMS text
    /// must show the code (DESIGN.md: the body holds it).
    fn check(&self, source: &Source) -> Result<(), TemplateLoadError> {
        let name = source.text.name(&source.locale);
        let failed =
            |e: TemplateError| TemplateLoadError::template(&source.origin, &source.body, &e.source);
        match source.text {
            Text::Sms => {
                let sample = vars::sms();
                let text = self.render_named(&name, &sample).map_err(failed)?;
                if !text.contains(sample.code()) {
                    return Err(TemplateLoadError::MissingCode {
                        path: source.origin.clone(),
                    });
                }
                Ok(())
            }
            Text::Email(kind) => vars::email(kind).into_iter().try_for_each(|sample| {
                self.render_email_named(name.clone(), sample)
                    .map(drop)
                    .map_err(failed)
            }),
        }
    }

    /// The locales `text` has.
    fn locales_of(&self, text: Text) -> &[String] {
        self.locales.get(&text).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The locale used for `text`: an exact match (but for case and `-`
    /// against `_`: `pt_BR` finds `pt-BR`), then the language alone (`en-GB`
    /// → `en`; `zh-TW` → none), then `en`.
    fn resolve(&self, text: Text, requested: Option<&str>) -> &str {
        let locales = self.locales_of(text);
        let requested = requested.unwrap_or(FALLBACK);
        let language = requested.split(['-', '_']).next().unwrap_or("");
        [requested, language]
            .iter()
            .find_map(|wanted| locales.iter().find(|l| locale::same_tag(l, wanted)))
            .map(String::as_str)
            .unwrap_or(FALLBACK)
    }

    /// The locales SMS texts exist in.
    pub fn sms_locales(&self) -> &[String] {
        self.locales_of(Text::Sms)
    }

    /// The locales `kind` exists in.
    pub fn email_locales(&self, kind: EmailKind) -> &[String] {
        self.locales_of(Text::Email(kind))
    }

    /// The locale an SMS asked for in `requested` is written in.
    pub fn resolve_sms_locale(&self, requested: Option<&str>) -> &str {
        self.resolve(Text::Sms, requested)
    }

    fn render_named(&self, name: &str, vars: impl Serialize) -> Result<String, TemplateError> {
        self.env
            .get_template(name)
            .and_then(|t| t.render(vars))
            .map_err(|source| TemplateError {
                name: name.to_string(),
                source,
            })
    }

    /// Renders the SMS body; returns the locale used and the text.
    pub fn render_sms(
        &self,
        requested_locale: Option<&str>,
        code: &str,
        ttl_secs: u64,
    ) -> Result<(String, String), TemplateError> {
        let locale = self.resolve(Text::Sms, requested_locale).to_string();
        let name = Text::Sms.name(&locale);
        let vars = vars::SmsVars::new(code, ttl_secs);
        let mut body = match self.plain.get(&name) {
            Some(plain) => plain.render(&vars),
            None => self.render_named(&name, vars)?,
        };
        body.truncate(body.trim_end().len());
        Ok((locale, body))
    }

    /// Renders the `subject` and `body` blocks of `email/<locale>/<kind>.txt`.
    pub fn render_email(
        &self,
        kind: EmailKind,
        requested_locale: Option<&str>,
        vars: impl Serialize,
    ) -> Result<RenderedEmail, TemplateError> {
        let text = Text::Email(kind);
        let name = text.name(self.resolve(text, requested_locale));
        self.render_email_named(name, vars)
    }

    fn render_email_named(
        &self,
        name: String,
        vars: impl Serialize,
    ) -> Result<RenderedEmail, TemplateError> {
        let rendered = self.env.get_template(&name).and_then(|t| {
            // The whole text is discarded; only the two blocks are kept.
            let mut captured = t.render_captured(vars)?;
            captured.with_state_mut(|state| {
                Ok((state.render_block("subject")?, state.render_block("body")?))
            })
        });
        let (subject, body) = rendered.map_err(|source| TemplateError { name, source })?;
        // A header must stay one line, whatever a variable held: not only
        // control characters but line and paragraph separators (which mail
        // clients break lines at) and format characters (bidi overrides)
        // go. `=?` would open an encoded word a mail client decodes, so a
        // name could smuggle in text of its choosing: spaced apart.
        let subject = subject
            .split(crate::domain::text::disguises)
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
            .replace("=?", "= ?");
        Ok(RenderedEmail {
            subject: subject.trim().to_string(),
            body: format!("{}\n", body.trim()),
        })
    }
}

/// The templates in force, swapped whole on reload; a send under way keeps
/// the set it started with.
pub type TemplatesCell = crate::in_force::InForce<Templates>;

/// An email's text, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedEmail {
    /// One line.
    pub subject: String,
    /// Plain text, ending in one newline.
    pub body: String,
}

#[cfg(test)]
mod dir_tests;
#[cfg(test)]
mod tests;
