//! The SMS texts that are plain text with `{{ variable }}` holes and
//! nothing else (every compiled-in one, and most an operator writes) are
//! rendered by joining their parts: the template engine cost about a
//! microsecond and a tenth of a send's allocations for what is a string
//! join. A text with anything else (a filter, a tag, a comment, whitespace
//! control) has no plain form and goes through minijinja; so does one whose
//! plain form renders the sample differently (checked at load).

use super::vars::SmsVars;

/// A variable of the SMS texts (`vars::SmsVars`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Hole {
    Code,
    TtlMinutes,
    TtlSecs,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Hole(Hole),
}

/// An SMS text as literal parts and holes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlainSms {
    parts: Vec<Part>,
    /// The literal parts' length, to size the answer once.
    literal_len: usize,
}

impl PlainSms {
    /// The plain form of `source`, when it has one.
    pub(super) fn parse(source: &str) -> Option<Self> {
        // minijinja drops one trailing newline of a template.
        let source = source
            .strip_suffix('\n')
            .map(|s| s.strip_suffix('\r').unwrap_or(s))
            .unwrap_or(source);
        if source.contains("{%") || source.contains("{#") {
            return None;
        }
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find("{{") {
            let after = &rest[open + 2..];
            let close = after.find("}}")?;
            let hole = match after[..close].trim_matches(' ') {
                "code" => Hole::Code,
                "ttl_minutes" => Hole::TtlMinutes,
                "ttl_secs" => Hole::TtlSecs,
                _ => return None,
            };
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            parts.push(Part::Hole(hole));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        let literal_len = parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.len(),
                Part::Hole(_) => 0,
            })
            .sum();
        Some(Self { parts, literal_len })
    }

    /// The text with `vars` in its holes.
    pub(super) fn render(&self, vars: &SmsVars<'_>) -> String {
        use std::fmt::Write;
        let mut out = String::with_capacity(self.literal_len + 16);
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Hole(Hole::Code) => out.push_str(vars.code()),
                Part::Hole(Hole::TtlMinutes) => {
                    let _ = write!(out, "{}", vars.ttl_minutes());
                }
                Part::Hole(Hole::TtlSecs) => {
                    let _ = write!(out, "{}", vars.ttl_secs());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    use super::*;

    fn engine(source: &str, vars: &SmsVars<'_>) -> String {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template("t", source).unwrap();
        env.get_template("t").unwrap().render(vars).unwrap()
    }

    #[test]
    fn plain_texts_render_as_the_engine_renders_them() {
        let vars = SmsVars::new("804213", 301);
        for source in [
            include_str!("../../../templates/sms/en.txt"),
            include_str!("../../../templates/sms/zh-CN.txt"),
            "{{code}}",
            "{{ code }} is your code\n",
            "code: {{code}}, {{ttl_secs}} s, {{ ttl_minutes }} min\r\n",
            "no holes at all",
            "braces { alone } and }} closing",
            "",
        ] {
            let plain = PlainSms::parse(source).unwrap_or_else(|| panic!("{source:?}"));
            assert_eq!(plain.render(&vars), engine(source, &vars), "{source:?}");
        }
    }

    #[test]
    fn anything_but_plain_holes_goes_to_the_engine() {
        for source in [
            "{{ code|upper }}",
            "{{- code }}",
            "{{ code -}}",
            "{% if true %}{{ code }}{% endif %}",
            "{# note #}{{ code }}",
            "{{ other }}",
            "{{ code }} {{ unclosed",
            "{{ 'x' }}",
        ] {
            assert_eq!(PlainSms::parse(source), None, "{source:?}");
        }
    }
}
