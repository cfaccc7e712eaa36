//! Reading a third party's answer (an SMS provider's, a captcha provider's,
//! an OpenID provider's) with a ceiling: reqwest's `bytes()` and `json()`
//! take whatever the server sends, so a provider behind a broken proxy, or
//! a URL pointed at the wrong server, could grow the process by hundreds of
//! megabytes per call (a 200 MB siteverify answer, seen in a test).

/// The most any provider's answer may hold: a siteverify or error answer is
/// a few hundred bytes, an OpenID discovery document or key set a few
/// kilobytes.
pub(crate) const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Why an answer's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The body went past [`MAX_ANSWER_BYTES`]: the rest is not read.
    #[error("answer larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    /// Reading failed (a reset, the call's timeout); the error leaves out
    /// the URL, which may carry a token.
    #[error("{0}")]
    Read(reqwest::Error),
}

/// The body of `response`, read chunk by chunk up to `MAX_ANSWER_BYTES`.
pub(crate) async fn read(mut response: reqwest::Response) -> Result<Vec<u8>, AnswerError> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(AnswerError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| AnswerError::Read(e.without_url()))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(AnswerError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The body of `response` as JSON, read as [`read`] does.
pub(crate) async fn json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, JsonAnswerError> {
    let body = read(response).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// Why an answer's body is not the JSON expected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JsonAnswerError {
    /// See [`AnswerError`].
    #[error(transparent)]
    Body(#[from] AnswerError),
    /// The body is not that JSON.
    #[error("unreadable JSON: {0}")]
    Json(#[from] serde_json::Error),
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server answering `chunks` chunks of 64 KiB, chunked, with no
    /// `Content-Length` to refuse early.
    async fn chunked_server(chunks: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..chunks {
                let size = format!("{:x}\r\n", chunk.len());
                if socket.write_all(size.as_bytes()).await.is_err()
                    || socket.write_all(&chunk).await.is_err()
                    || socket.write_all(b"\r\n").await.is_err()
                {
                    return; // the reader stopped
                }
            }
            let _ = socket.write_all(b"0\r\n\r\n").await;
        });
        format!("http://{address}/")
    }

    #[tokio::test]
    async fn a_chunked_answer_is_read_up_to_the_ceiling() {
        let client = reqwest::Client::new();
        let small = client.get(chunked_server(2).await).send().await.unwrap();
        assert_eq!(read(small).await.unwrap().len(), 128 * 1024);

        let large = client.get(chunked_server(32).await).send().await.unwrap();
        assert!(large.content_length().is_none());
        assert!(matches!(read(large).await, Err(AnswerError::TooLarge)));
    }
}
