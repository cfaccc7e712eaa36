//! The README and the pages under `docs/`: every relative link leads to a file
//! of the repository (and, with a `#fragment`, to a heading of that page), and
//! every page is reachable from the README.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README and every Markdown page under `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text of a page outside fenced code blocks (links in code are examples).
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every `[text](target)` link target of a page's prose.
fn links(text: &str) -> Vec<String> {
    let pattern = regex::Regex::new(r"\]\(([^)\s]+)\)").expect("the link pattern");
    pattern
        .captures_iter(&prose(text))
        .map(|c| c[1].to_string())
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as
/// hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|rest| slug(rest.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_relative_link_in_the_readme_and_docs_leads_somewhere() {
    let root = Path::new(ROOT).canonicalize().expect("the repository");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page is readable");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a page's folder").join(path)
            };
            let Ok(file) = file.canonicalize() else {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            };
            if !file.starts_with(&root) {
                broken.push(format!(
                    "{}: {target} (outside the repository)",
                    page.display()
                ));
                continue;
            }
            if let Some(fragment) = fragment {
                let target_text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the pattern right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_leads_to_every_page_under_docs() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let linked: BTreeSet<String> = links(&readme).into_iter().collect();
    let missing: Vec<String> = pages()
        .into_iter()
        .skip(1)
        .filter_map(|page| {
            let name = page.file_name()?.to_str()?.to_string();
            let target = format!("docs/{name}");
            (!linked
                .iter()
                .any(|l| l == &target || l.starts_with(&format!("{target}#"))))
            .then_some(target)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "pages the README does not link: {missing:?}"
    );
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; details belong in docs/"
    );
}

#[test]
fn headings_become_github_anchors() {
    assert_eq!(slug(" The admin port"), "the-admin-port");
    assert_eq!(
        slug("Where this differs from or adds to DESIGN.md"),
        "where-this-differs-from-or-adds-to-designmd"
    );
    assert_eq!(slug("The console's overview"), "the-consoles-overview");
}
