//! The examples of `docs/integration.md`, run as written against the real
//! binary: every `sh` block through bash (its `localhost:8080` pointed at the
//! server), with each answer that the block shows as a JSON comment compared
//! to the real one; and the Python `login()` driven through a lockout.

use serde_json::Value;

use crate::support::process::{config_file, Tollgate};

const GUIDE: &str = include_str!("../../docs/integration.md");

/// The fenced blocks of `language` in the guide, indentation removed.
fn blocks(language: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<(usize, Vec<String>)> = None;
    for line in GUIDE.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut current {
            None if trimmed == format!("```{language}") => current = Some((indent, Vec::new())),
            Some((_, lines)) if trimmed == "```" => {
                found.push(lines.join("\n"));
                current = None;
            }
            Some((indent, lines)) => lines.push(line.get(*indent..).unwrap_or("").to_string()),
            None => {}
        }
    }
    found
}

async fn server(dir: &std::path::Path) -> Tollgate {
    Tollgate::start(&config_file(
        dir,
        r#"api_keys = ["backend-key-0123456789"]"#,
        "",
    ))
    .await
}

/// The answers a block shows: comment lines holding one JSON object
/// (after an optional status), in order; `None` for a comment that shows a
/// choice (`{…}  or  {…}`).
fn shown_answers(block: &str) -> Vec<Option<Value>> {
    block
        .lines()
        .filter_map(|line| line.trim().strip_prefix("# "))
        .filter(|comment| comment.contains('{'))
        .map(|comment| {
            let json = comment.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
            serde_json::from_str(json).ok()
        })
        .collect()
}

#[tokio::test]
async fn the_curl_examples_answer_what_the_guide_shows() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path()).await;
    let host = server.address.trim_start_matches("http://");
    let sh = blocks("sh");
    assert_eq!(sh.len(), 3, "the guide's curl blocks: {sh:#?}");
    let mut compared = 0;
    for block in sh {
        let script = block.replace("localhost:8080", host);
        let output = tokio::process::Command::new("bash")
            .args(["-c", &format!("set -e\n{script}")])
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{script}: {output:?}");
        // curl -s prints no newline after a body: split between objects.
        let stdout = String::from_utf8(output.stdout).unwrap();
        let answers: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
            .into_iter::<Value>()
            .map(|v| v.unwrap_or_else(|e| panic!("{script}: not JSON ({e}): {stdout}")))
            .collect();
        assert_eq!(answers.len(), script.matches("curl ").count(), "{stdout}");
        for answer in &answers {
            assert!(answer.get("error").is_none(), "{script}: {answer}");
        }
        let shown = shown_answers(&block);
        for (i, expected) in shown.iter().enumerate() {
            match expected {
                Some(expected) => {
                    assert_eq!(&answers[i], expected, "{script}");
                    compared += 1;
                }
                None => assert!(answers[i].get("valid").is_some(), "{}", answers[i]),
            }
        }
    }
    assert_eq!(compared, 2, "the check's and the send's answers are shown");
}

#[tokio::test]
async fn the_python_login_function_walks_a_user_into_a_captcha_and_a_lock_and_refuses_what_cannot_count(
) {
    let python = std::env::var("TOLLGATE_PYTHON")
        .expect("TOLLGATE_PYTHON names a python with `requests` (scripts/test.sh sets it)");
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path()).await;
    let [example] = blocks("python").try_into().expect("one Python example");
    let driver = format!(
        r#"
{example}

TOLLGATE = "{address}"
import json
wrong = lambda user, password: False
right = lambda user, password: True
results = {{
    "welcome": login("carol", "pw", "203.0.113.5", False, right),
    "no_captcha": [login("bob", "pw", "203.0.113.9", False, wrong) for _ in range(4)],
    "failures": [login("dave", "pw", "203.0.113.7", True, wrong) for _ in range(11)],
    "uncountable": [
        login("erin", "pw", "not-an-address", False, right),
        login("erin" + " " * 300, "pw", "203.0.113.8", False, right),
        login("erin\t", "pw", "203.0.113.8", False, right),
        ask("/login/attempt", {{"user": "fay", "ip": "203.0.113.10", "success": False,
                               "locale": "en-US,en;q=0.9"}}),
    ],
}}
print(json.dumps(results))
"#,
        address = server.address
    );
    let output = tokio::process::Command::new(&python)
        .args(["-c", &driver])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let results: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(results["welcome"], "welcome");
    // login.captcha_after = 3: the fourth try without a solved captcha is sent to one.
    assert_eq!(
        results["no_captcha"],
        serde_json::json!([
            "wrong password",
            "wrong password",
            "wrong password",
            "captcha"
        ])
    );
    // login.lock_after = 10 from one address: the eleventh is refused before
    // the password is checked.
    let failures = results["failures"].as_array().unwrap();
    assert!(
        failures[..10].iter().all(|r| r == "wrong password"),
        "{failures:?}"
    );
    // Bodies tollgate refuses (400) count nothing, so the login fails even
    // with the right password: else whoever wrote those values (a header the
    // address is read from, a name the backend trims) would guess uncounted.
    assert_eq!(
        results["uncountable"],
        serde_json::json!(["refused", "refused", "refused", "refused"])
    );
    let last = failures[10].as_str().unwrap();
    assert!(
        last == "locked, retry in 900 s" || last == "locked, retry in 899 s",
        "{last}"
    );
}
