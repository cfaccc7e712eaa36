//! A real SMTP server inside the test process (mailin-embedded), on port 0,
//! that keeps every email it accepts.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mailin_embedded::{response, Handler, Response, Server};
use mailparse::MailHeaderMap;
use parking_lot::Mutex;

/// One accepted email, decoded.
#[derive(Debug, Clone)]
pub struct Mail {
    /// The envelope's recipients.
    pub to: Vec<String>,
    /// The envelope's sender.
    pub from: String,
    pub subject: String,
    /// The `From:` header.
    pub from_header: String,
    /// The `Auto-Submitted:` header, empty without one.
    pub auto_submitted: String,
    pub body: String,
    pub received_at: Instant,
}

#[derive(Clone, Default)]
pub struct Inbox {
    mails: Arc<Mutex<Vec<Mail>>>,
    refuse: Arc<AtomicU32>,
    tries: Arc<AtomicU32>,
    refused_recipients: Arc<Mutex<Vec<String>>>,
}

impl Inbox {
    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().clone()
    }

    /// Answer the next `n` messages' `MAIL FROM` with `451` (a transient failure).
    pub fn refuse_next(&self, n: u32) {
        self.refuse.store(n, Ordering::SeqCst);
    }

    /// Answer `RCPT TO` for `address` with `550` (no such mailbox), always.
    pub fn refuse_recipient(&self, address: &str) {
        self.refused_recipients.lock().push(address.to_string());
    }

    /// Messages offered, accepted or not.
    pub fn tries(&self) -> u32 {
        self.tries.load(Ordering::SeqCst)
    }

    /// Waits (10 s at most) until at least `n` emails arrived; returns them all.
    pub async fn wait_for(&self, n: usize) -> Vec<Mail> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mails = self.mails();
            if mails.len() >= n {
                return mails;
            }
            assert!(
                Instant::now() < deadline,
                "waited 10 s for {n} emails, got {}: {mails:#?}",
                mails.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until an email to `address` arrived; returns every email so far.
    pub async fn wait_for_mail_to(&self, address: &str) -> Vec<Mail> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mails = self.mails();
            if mails.iter().any(|m| m.to.iter().any(|to| to == address)) {
                return mails;
            }
            assert!(
                Instant::now() < deadline,
                "waited 10 s for an email to {address}: {mails:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[derive(Clone)]
struct Session {
    inbox: Inbox,
    from: String,
    to: Vec<String>,
    data: Vec<u8>,
}

impl Handler for Session {
    fn mail(&mut self, _ip: std::net::IpAddr, _domain: &str, _from: &str) -> Response {
        self.inbox.tries.fetch_add(1, Ordering::SeqCst);
        // Refused at MAIL FROM: mailin stays in step with the client there
        // (after a refused end of DATA it would not).
        let refuse = &self.inbox.refuse;
        if refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return response::INTERNAL_ERROR;
        }
        response::OK
    }

    fn rcpt(&mut self, to: &str) -> Response {
        let refused = self.inbox.refused_recipients.lock();
        if refused.iter().any(|address| to.contains(address.as_str())) {
            return response::NO_MAILBOX;
        }
        response::OK
    }

    fn data_start(&mut self, _domain: &str, from: &str, _is8bit: bool, to: &[String]) -> Response {
        self.from = from.to_string();
        self.to = to.to_vec();
        self.data.clear();
        response::OK
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.data.extend_from_slice(buf);
        Ok(())
    }

    fn data_end(&mut self) -> Response {
        let parsed = mailparse::parse_mail(&self.data).expect("a well-formed email");
        let header = |name: &str| parsed.headers.get_first_value(name).unwrap_or_default();
        let mail = Mail {
            to: self.to.clone(),
            from: self.from.clone(),
            subject: header("Subject"),
            from_header: header("From"),
            auto_submitted: header("Auto-Submitted"),
            body: parsed
                .get_body()
                .expect("a decodable body")
                .replace("\r\n", "\n"),
            received_at: Instant::now(),
        };
        self.inbox.mails.lock().push(mail);
        response::OK
    }
}

/// Starts a server on a free port; returns its inbox and `smtp://127.0.0.1:<port>`.
/// The listener is bound before this returns, so clients may connect at once.
pub fn start() -> (Inbox, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("smtp://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let inbox = Inbox::default();
    let session = Session {
        inbox: inbox.clone(),
        from: String::new(),
        to: Vec::new(),
        data: Vec::new(),
    };
    let mut server = Server::new(session);
    server
        .with_name("smtp.test")
        .with_num_threads(4)
        .with_tcp_listener(listener);
    // Serves for the rest of the test process; one thread per test that needs it.
    std::thread::spawn(move || {
        if let Err(e) = server.serve() {
            eprintln!("the test SMTP server stopped: {e}");
        }
    });
    (inbox, url)
}
