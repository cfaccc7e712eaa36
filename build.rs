// `sqlx::migrate!` embeds the migration files it finds, and cargo tracks
// only those: without this, a migration added to the directory is left out
// of an incremental build until some source file changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
