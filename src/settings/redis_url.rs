//! `store.redis_url` as fred reads it: the comma-separated cluster form
//! rewritten into fred's own, and parsed by fred at start-up as at connect
//! time, so that a URL `check-config` passes is one the store can use.

use fred::prelude::Config;

/// `redis-cluster://h1:p1,h2:p2` → `redis-cluster://h1:p1?node=h2:p2`, the form
/// fred parses. Other URLs are returned unchanged.
pub fn fred_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    if !hosts.contains(',') {
        return url.to_owned();
    }
    let mut hosts = hosts.split(',').filter(|h| !h.is_empty());
    let first = hosts.next().unwrap_or_default();
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut params: Vec<String> = query
        .into_iter()
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .collect();
    params.extend(hosts.map(|h| format!("node={h}")));
    format!("{scheme}://{userinfo}{first}{path}?{}", params.join("&"))
}

/// fred's configuration of `url`, or why it has none (never the URL, which
/// may hold a password).
pub fn fred_config(url: &str) -> Result<Config, String> {
    Config::from_url(&fred_url(url)).map_err(|e| e.details().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comma_separated_cluster_nodes_become_node_parameters() {
        assert_eq!(
            fred_url("redis-cluster://h1:7000,h2:7001,h3:7002"),
            "redis-cluster://h1:7000?node=h2:7001&node=h3:7002"
        );
        assert_eq!(
            fred_url("redis-cluster://u:p@h1:7000,h2:7001/?x=1"),
            "redis-cluster://u:p@h1:7000/?x=1&node=h2:7001"
        );
        assert_eq!(
            fred_url("redis://127.0.0.1:6379/2"),
            "redis://127.0.0.1:6379/2"
        );
    }

    #[test]
    fn both_url_forms_parse() {
        let single = Config::from_url(&fred_url("redis://127.0.0.1:6379/2")).unwrap();
        assert_eq!(single.database, Some(2));
        let cluster = Config::from_url(&fred_url("redis-cluster://h1:7000,h2:7001")).unwrap();
        match cluster.server {
            fred::types::config::ServerConfig::Clustered { hosts, .. } => {
                assert_eq!(hosts.len(), 2)
            }
            other => panic!("expected a cluster config, got {other:?}"),
        }
    }
}
