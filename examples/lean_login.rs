//! The lean limit of `/login/attempt`: actix-web, fred and tollgate's own
//! `lua/login_attempt.lua` rendered with the default policy (the script
//! tollgate runs, `render_login_attempt`), and nothing else — no
//! API key, no audit trail, no metrics, no logs, no lists. What tollgate does
//! beyond one script call per request costs what this service does not; the
//! load benchmark (`scripts/bench.py`) runs it beside tollgate to show that
//! cost (issue "Speed against the same job", item 3).
//!
//! `cargo run --release --example lean_login -- 127.0.0.1:18088 redis://127.0.0.1:6395 [workers]`
//! (workers: actix's default, one per CPU, unless given; the benchmark
//! gives it tollgate's `server.workers`).

use std::cell::RefCell;

use actix_web::{web, App, HttpResponse, HttpServer};
use fred::prelude::{Client, ClientLike, Config};
use fred::types::scripts::Script;
use serde::Deserialize;
use tollgate::guard::Policy;
use tollgate::settings::Settings;
use tollgate::store::redis::{render_login_attempt, unpack_answer, LoginShape};

/// The allocator tollgate's binary uses, so that the two compare like for like.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

thread_local! {
    /// Each worker's own client, as tollgate gives each HTTP worker one.
    static CLIENT: RefCell<Option<Client>> = const { RefCell::new(None) };
}

#[derive(Deserialize)]
struct Attempt {
    user: String,
    ip: Option<String>,
    success: bool,
}

/// tollgate's own default policy (`Settings::defaults`, `[login]`), rendered
/// into the script as tollgate renders it, so the two cannot drift apart.
fn script() -> std::io::Result<Script> {
    let settings = Settings::defaults().map_err(std::io::Error::other)?;
    let policy = Policy::from_settings(&settings).map_err(std::io::Error::other)?;
    let login = &policy.login;
    Ok(Script::from_lua(render_login_attempt(&LoginShape {
        policy: login.store,
        pair: login.pair_lock.is_some(),
        ip: Some(login.ip.limits()),
        network: None,
    })))
}

/// The attempt's own facts, in the order of the script's ARGV: member,
/// success, captcha passed, demanded, shadow, IP blocked, the pair's IP,
/// and no deadline (tollgate hands the script one: its `deadline` module).
fn argv(member: String, success: bool, ip: &str) -> Vec<String> {
    let mut args = vec![member, u8::from(success).to_string()];
    args.extend(["0", "0", "0", "0"].map(String::from));
    args.push(ip.to_string());
    args.push("0".into());
    args
}

async fn attempt(body: web::Json<Attempt>, script: web::Data<Script>) -> HttpResponse {
    let user = body.user.to_lowercase();
    let ip = body.ip.as_deref().unwrap_or("unknown");
    let keys = vec![
        format!("lean:{{user:{user}}}:login_attempt"),
        format!("lean:{{user:{user}}}:lock"),
        format!("lean:{{user:{user}}}:lock:ip:{ip}"),
        format!("lean:{{user:{user}}}:login_pairs"),
        format!("lean:{{ip:{ip}}}:login_attempt"),
    ];
    let member = uuid::Uuid::now_v7().to_string();
    let Some(client) = CLIENT.with(|c| c.borrow().clone()) else {
        return HttpResponse::ServiceUnavailable().finish();
    };
    let result: Result<fred::bytes::Bytes, _> = script
        .evalsha_with_reload(&client, keys, argv(member, body.success, ip))
        .await;
    // The answer is 11 numbers packed as little-endian doubles.
    match result.map(|packed| unpack_answer(&packed, 11)) {
        Ok(Ok(r)) => {
            // Refused for a live lock, or this failure started one.
            let locked = r[0] == 1 || r[0] == 3 || r[4] >= 0 || r[7] >= 0;
            let decision = match r[0] {
                1 | 3 => "deny",
                2 => "challenge",
                _ => "allow",
            };
            HttpResponse::Ok().json(serde_json::json!({
                "decision": decision,
                "captcha_required": r[0] == 2 || r[3] == 1,
                "locked": locked,
                "failures": r[2],
            }))
        }
        _ => HttpResponse::ServiceUnavailable().finish(),
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let bind = args.next().unwrap_or_else(|| "127.0.0.1:18088".into());
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let config = Config::from_url(&url).map_err(std::io::Error::other)?;
    let workers = match args.next() {
        Some(n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(std::io::Error::other(format!(
                    "workers (the third argument) must be a positive integer, not {n:?}"
                )))
            }
        },
        None => None,
    };
    let script = web::Data::new(script()?);
    let server = HttpServer::new(move || {
        let client = Client::new(config.clone(), None, None, None);
        let _connection = client.connect();
        CLIENT.with(|c| *c.borrow_mut() = Some(client));
        App::new()
            .app_data(script.clone())
            .route("/login/attempt", web::post().to(attempt))
    });
    let server = match workers {
        Some(n) => server.workers(n),
        None => server,
    };
    server.bind(bind)?.run().await
}
