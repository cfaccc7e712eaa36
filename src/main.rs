//! The `tollgate` binary: the command line (`serve`, `migrate`,
//! `check-config`, `openapi`, `healthcheck`) over the library, which does
//! everything else.

mod healthcheck;

/// mimalloc: glibc's malloc and free were about a tenth of the service's CPU
/// under load (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tollgate::delivery::{TemplateDirs, Templates};
use tollgate::reload::Reloader;
use tollgate::settings::Settings;
use tollgate::startup::Application;

/// Self-hosted anti-abuse decisions for SMS verification and logins.
#[derive(Parser)]
#[command(name = "tollgate", version)]
struct Cli {
    /// TOML config file layered over the embedded defaults.
    #[arg(long, global = true, env = "TOLLGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Apply the audit database migrations and exit.
    Migrate,
    /// Validate the config and print it as TOML, secrets masked.
    CheckConfig,
    /// Print the OpenAPI document of the API (as `docs/openapi.json` keeps it)
    /// and exit; reads no config.
    Openapi,
    /// GET /healthz of the running server and exit 0 on 200, 1 otherwise
    /// (a container's HEALTHCHECK, with no curl in the image).
    Healthcheck {
        /// Ask /readyz instead: 200 only while the store and the audit
        /// database answer.
        #[arg(long)]
        ready: bool,
        /// The server's address (host:port); given more than once, each is
        /// asked in turn until one answers 200. Default: the config's
        /// server.admin_bind, then server.bind (readiness: server.bind
        /// alone), 0.0.0.0 and :: read as loopback; given, no config is
        /// read.
        #[arg(long)]
        address: Vec<SocketAddr>,
        /// Longest wait for the answer, shared among the addresses asked.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Write `text` to standard output. A reader that went away (`tollgate
/// openapi | head`) ends the output, not the process in a panic, as
/// `print!` does on a closed pipe.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => Ok(written?),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let load = || Settings::load(cli.config.as_deref());
    match cli.command.unwrap_or(Command::Serve) {
        // The document is the code's, not the config's: no file is read.
        Command::Openapi => print_out(&tollgate::routes::openapi::pretty_document())?,
        Command::Healthcheck {
            ready,
            address,
            timeout,
        } => {
            let addresses = match address {
                given if !given.is_empty() => given,
                _ => {
                    let server = load()?.server;
                    healthcheck::listeners_to_ask(server.bind, server.admin_bind, ready)
                        .into_iter()
                        .map(healthcheck::local_address)
                        .collect::<anyhow::Result<_>>()?
                }
            };
            let path = if ready { "/readyz" } else { "/healthz" };
            let status = healthcheck::probe_any(&addresses, path, timeout).await?;
            print_out(&format!("{status}\n"))?;
        }
        Command::CheckConfig => {
            let settings = load()?;
            // The templates are part of what start-up checks.
            Templates::load(&TemplateDirs::of(&settings))?;
            // What start-up would warn of, on stderr: stdout stays TOML.
            tollgate::telemetry::init();
            tollgate::settings::warnings::warn_of_risky_settings(&settings);
            print_out(&settings.to_redacted_toml())?;
        }
        Command::Migrate => {
            migrate(&load()?).await?;
            print_out("tollgate: audit database is up to date\n")?;
        }
        Command::Serve => {
            tollgate::telemetry::init();
            match tollgate::startup::watch_stop_signals() {
                Ok(()) => tracing::info!("starting: SIGTERM and SIGINT stop the service from now"),
                Err(e) => tracing::warn!(error = %e, "SIGTERM cannot be watched yet"),
            }
            // Before the config is read: SIGHUP and edits during start-up
            // are held for the running service, not lost (or fatal).
            let mut reloader = Reloader::prepare(cli.config.clone())?;
            let settings = load()?;
            reloader.watch_settings(&settings);
            serve(settings, reloader)
                .await
                .inspect_err(|e| tracing::error!(error = ?e, "tollgate stopped with an error"))?;
        }
    }
    Ok(())
}

async fn serve(settings: Settings, reloader: Reloader) -> anyhow::Result<()> {
    let app = Application::build(settings).await?;
    reloader.start(app.reloadable());
    app.run_until_stopped().await?;
    if tollgate::audit::writer_panicked() {
        // A failure exit, so that systemd's Restart=on-failure starts the
        // next process too; it replays the journal.
        anyhow::bail!("stopped because the audit writer panicked (see the ERROR above)");
    }
    Ok(())
}

async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let db = tollgate::audit::AuditDb::connect_lazy(settings.audit.database_url.expose())?;
    db.migrate().await?;
    // Partitions (PostgreSQL) for every day of the retention period, so
    // that rows of any time within it can be inserted by plain SQL too.
    let now = chrono::Utc::now();
    let first = tollgate::audit::retention::cutoff(now, settings.audit.retention);
    let made = db
        .prepare_partitions(tollgate::audit::db::partitions::day(first), now)
        .await?;
    if made > 0 {
        tracing::info!(partitions = made, "made audit partitions");
    }
    Ok(())
}
