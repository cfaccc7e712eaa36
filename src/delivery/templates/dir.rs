//! An operator's templates directory, laid over the compiled-in templates.
//!
//! - `sms.templates_dir`: `<locale>.txt` files (`en.txt`, `fr.txt`).
//! - `email.templates_dir`: `<locale>/lock_notice.txt` and
//!   `<locale>/alert_digest.txt`.
//!
//! The locale is the file (or directory) name: a new name is a new locale.
//! Names starting with `.` are skipped, so the `..data` links of a mounted
//! Kubernetes ConfigMap are not read as templates, and so are editors'
//! backups (`en.txt~`) and `lost+found`; anything else that is not a template
//! is an error, so a misspelt name is not silently ignored.

use std::path::{Path, PathBuf};

use super::{EmailKind, Source, Text};
use crate::domain::Locale;

/// A templates directory or one of its files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateLoadError {
    /// A directory could not be listed, or a file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The directory or file that could not be read.
        path: PathBuf,
        /// Why the file system refused.
        source: std::io::Error,
    },
    /// An entry that is not laid out as a template: a misspelt file name, a
    /// file where a locale directory belongs, a name that is not a locale.
    #[error("{}: {reason}", path.display())]
    Layout {
        /// The entry that does not fit.
        path: PathBuf,
        /// What was expected there, for the operator to read.
        reason: String,
    },
    /// An SMS text that does not show the code.
    #[error("{}: the text does not show the code: write {{{{ code }}}} in it", path.display())]
    MissingCode {
        /// The SMS template's file.
        path: PathBuf,
    },
    /// A syntax error, or a failed render with sample variables.
    #[error("{}: {message}", at(path, *line))]
    Template {
        /// The template's file (its name under `templates/` if compiled in).
        path: PathBuf,
        /// The line minijinja points at, when it knows one.
        line: Option<usize>,
        /// minijinja's error, with the words it is about when it knows them.
        message: String,
    },
}

fn at(path: &Path, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{}:{line}", path.display()),
        None => path.display().to_string(),
    }
}

impl TemplateLoadError {
    /// `error` in the template `source` read from `path`; the words it is
    /// about are quoted when minijinja knows them (it does not name an
    /// undefined variable otherwise).
    pub(super) fn template(path: &Path, source: &str, error: &minijinja::Error) -> Self {
        let mut message = match error.detail() {
            Some(detail) => format!("{}: {detail}", error.kind()),
            None => error.kind().to_string(),
        };
        if let Some(words) = error.range().and_then(|range| source.get(range)) {
            message.push_str(&format!(" (at `{words}`)"));
        }
        Self::Template {
            path: path.to_path_buf(),
            line: error.line(),
            message,
        }
    }

    fn layout(path: &Path, reason: impl Into<String>) -> Self {
        Self::Layout {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Names in a templates directory that are not read: hidden ones (a
/// ConfigMap's `..data`, an editor's `.en.txt.swp`), an editor's backup
/// (`en.txt~`) and a file system's `lost+found`.
pub(crate) fn skipped(name: &str) -> bool {
    name.starts_with('.') || name.ends_with('~') || name == "lost+found"
}

/// The entries of `dir` not [`skipped`], sorted, with whether each is a
/// directory (symlinks followed, as a ConfigMap's files are links).
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf, bool)>, TemplateLoadError> {
    let read = |source| TemplateLoadError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let path = entry.map_err(read)?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            return Err(TemplateLoadError::layout(&path, "the name is not UTF-8"));
        };
        if skipped(&name) {
            continue;
        }
        let is_dir = std::fs::metadata(&path)
            .map_err(|source| TemplateLoadError::Read {
                path: path.clone(),
                source,
            })?
            .is_dir();
        found.push((name, path, is_dir));
    }
    found.sort();
    Ok(found)
}

/// The most a template file holds: an SMS is a few hundred bytes, a mail
/// notice a few thousand.
pub(crate) const MAX_TEMPLATE_BYTES: u64 = 64 * 1024;

/// A template's text: a regular file (a FIFO would block the load, and a
/// reload with it, for good) of at most [`MAX_TEMPLATE_BYTES`].
fn read(path: &Path) -> Result<String, TemplateLoadError> {
    crate::regular_file::read_to_string(path, MAX_TEMPLATE_BYTES).map_err(|source| {
        TemplateLoadError::Read {
            path: path.to_path_buf(),
            source,
        }
    })
}

fn locale_of(path: &Path, name: &str) -> Result<String, TemplateLoadError> {
    Locale::parse(name).map(Locale::into_string).map_err(|_| {
        TemplateLoadError::layout(
            path,
            format!("{name:?} is not a locale (letters, digits, - and _, such as zh-CN)"),
        )
    })
}

/// The locales one directory names, so that two names of one locale
/// (`pt_BR` and `pt-BR`, `zh-CN` and `zh-cn`) are refused rather than one
/// silently left unused.
#[derive(Default)]
struct Named(Vec<String>);

impl Named {
    fn add(&mut self, path: &Path, locale: &str) -> Result<(), TemplateLoadError> {
        if let Some(earlier) = self
            .0
            .iter()
            .find(|l| crate::domain::locale::same_tag(l, locale))
        {
            return Err(TemplateLoadError::layout(
                path,
                format!("{locale:?} names the locale {earlier:?} names too: keep one"),
            ));
        }
        self.0.push(locale.to_string());
        Ok(())
    }
}

/// The `<locale>.txt` files of `sms.templates_dir`.
pub(super) fn sms_sources(dir: &Path) -> Result<Vec<Source>, TemplateLoadError> {
    let mut sources = Vec::new();
    let mut named = Named::default();
    for (name, path, is_dir) in entries(dir)? {
        let stem = name
            .strip_suffix(".txt")
            .filter(|_| !is_dir)
            .ok_or_else(|| {
                TemplateLoadError::layout(&path, "expected a <locale>.txt file, such as en.txt")
            })?;
        let locale = locale_of(&path, stem)?;
        named.add(&path, &locale)?;
        sources.push(Source {
            text: Text::Sms,
            locale,
            body: read(&path)?,
            origin: path,
        });
    }
    Ok(sources)
}

/// The `<locale>/<kind>.txt` files of `email.templates_dir`.
pub(super) fn email_sources(dir: &Path) -> Result<Vec<Source>, TemplateLoadError> {
    let mut sources = Vec::new();
    let mut named = Named::default();
    for (name, locale_dir, is_dir) in entries(dir)? {
        if !is_dir {
            return Err(TemplateLoadError::layout(
                &locale_dir,
                "expected a <locale> directory holding lock_notice.txt and alert_digest.txt",
            ));
        }
        let locale = locale_of(&locale_dir, &name)?;
        named.add(&locale_dir, &locale)?;
        for (file, path, is_dir) in entries(&locale_dir)? {
            let kind = EmailKind::ALL
                .into_iter()
                .find(|kind| !is_dir && file == format!("{}.txt", kind.as_str()))
                .ok_or_else(|| {
                    TemplateLoadError::layout(&path, "expected lock_notice.txt or alert_digest.txt")
                })?;
            sources.push(Source {
                text: Text::Email(kind),
                locale: locale.clone(),
                body: read(&path)?,
                origin: path,
            });
        }
    }
    Ok(sources)
}
