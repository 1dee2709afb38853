//! `peers`: other llama-swap compatible servers whose models are reached as `<peer>/<model>`.

use std::collections::BTreeMap;

use super::filters::{decode_filters, decode_timeouts};
use super::keys::{PEER_FILTER_KEYS, TIMEOUT_KEYS};
use crate::config::read::MapReader;
use crate::config::{ConfigError, ModelConfig, Peer};

pub(super) fn decode_peers(
    top: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, Peer>, ConfigError> {
    let r = top.child("peers", &[], &mut Vec::new())?;
    let mut out = BTreeMap::new();
    for (id, node) in r.entries() {
        let p = MapReader::new(
            node,
            &r.key(id),
            &["proxy", "apiKey", "models", "filters", "timeouts"],
            warnings,
        )?;
        out.insert(id.clone(), decode_peer(id, &p, models, warnings)?);
    }
    Ok(out)
}

/// `peers.<id>`: its URL, key, models, filters (no `setParamsByID`) and timeouts, in that order.
fn decode_peer(
    id: &str,
    p: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
    warnings: &mut Vec<String>,
) -> Result<Peer, ConfigError> {
    let proxy = peer_proxy(p)?;
    let peer_models = peer_models(id, p, models)?;
    let mut filters = decode_filters(p, PEER_FILTER_KEYS, warnings)?;
    filters.set_params_by_id.clear();
    Ok(Peer {
        proxy,
        api_key: p.string("apiKey")?.filter(|k| !k.is_empty()),
        models: peer_models,
        filters,
        timeouts: decode_timeouts(&p.child("timeouts", TIMEOUT_KEYS, warnings)?, Some(60))?,
    })
}

/// The peer's URL: http(s), and without credentials, which would never be sent.
fn peer_proxy(p: &MapReader<'_>) -> Result<String, ConfigError> {
    let proxy = p
        .string("proxy")?
        .ok_or_else(|| p.err("proxy", "a peer needs a proxy URL"))?;
    if !(proxy.starts_with("http://") || proxy.starts_with("https://"))
        || proxy.parse::<http::Uri>().is_err()
    {
        return Err(p.err("proxy", format!("{proxy:?} is not an http(s) URL")));
    }
    if proxy
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| a.as_str().contains('@')))
        == Some(true)
    {
        return Err(p.err(
            "proxy",
            "credentials in the URL are not sent; give the key as apiKey",
        ));
    }
    Ok(proxy)
}

/// The peer's models, none of which may shadow a local model or alias once prefixed.
fn peer_models(
    id: &str,
    p: &MapReader<'_>,
    models: &BTreeMap<String, ModelConfig>,
) -> Result<Vec<String>, ConfigError> {
    let peer_models = p.strings("models")?;
    if peer_models.is_empty() {
        return Err(p.err("models", "a peer needs at least one model"));
    }
    for m in &peer_models {
        let fqn = format!("{id}/{m}");
        if models.contains_key(&fqn) || models.values().any(|x| x.aliases.contains(&fqn)) {
            return Err(p.err(
                "models",
                format!("{fqn:?} collides with a local model or alias"),
            ));
        }
    }
    Ok(peer_models)
}
