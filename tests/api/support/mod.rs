//! Everything the API tests share: the app in process (`app`), the real
//! binary as a child process (`process`), audit databases and a proxy that
//! can cut them (`audit_db`), the rows they hold (`audit_trail`), an SMTP
//! server (`smtp`) and waiting with a deadline (`wait`).

pub mod app;
pub mod audit_db;
pub mod audit_trail;
pub mod process;
pub mod smtp;
pub mod wait;

/// Run the future `make` builds to its end on a runtime of its own, on
/// another thread, and wait for it: how a `Drop` (which cannot await)
/// cleans up after a test, whatever runtime the test had.
pub fn run_detached<F>(make: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let worker = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(make());
        }
    });
    let _ = worker.join();
}

/// Held by every test that moves
/// `tollgate_list_matches_total{list="allow",kind="ip",action="sms_send"}`
/// (a send from an allow-listed address) while one of them counts it: the
/// recorder is the process's, so a send in a test running beside the
/// counting one would land in its delta.
pub static ALLOW_LISTED_IP_SENDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether `request` holds an HTTP request's head and its whole body.
pub fn whole_request(request: &[u8]) -> bool {
    let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    request.len() >= end + 4 + length
}

/// The body of `request`'s answer, as text (a test's GET of a page).
pub async fn text_of(request: reqwest::RequestBuilder) -> String {
    request
        .send()
        .await
        .expect("an answer")
        .text()
        .await
        .expect("a text body")
}
