//! The HTTP client `openidconnect` calls the provider with: the project's
//! reqwest (rustls), with a timeout, and never following redirects (a
//! redirect from the provider could point tollgate at any address: SSRF).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use openidconnect::{AsyncHttpClient, HttpRequest, HttpResponse};

/// Why a call to the provider failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Building, sending or reading the request failed, or it timed out.
    #[error("{0}")]
    Reqwest(#[from] reqwest::Error),
    /// The answer's body could not be read whole (too large, or cut).
    #[error("{0}")]
    Answer(#[from] crate::answer_body::AnswerError),
    /// The answer could not be turned into `openidconnect`'s type.
    #[error("{0}")]
    Http(#[from] openidconnect::http::Error),
}

/// reqwest, without redirects, within `timeout` per call.
#[derive(Clone)]
pub struct Http(reqwest::Client);

impl Http {
    /// A client whose every call ends within `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .map(Self)
    }

    /// GET `url` and its body, when it answers 200.
    pub async fn get(&self, url: &str) -> Result<Vec<u8>, HttpError> {
        let response = self.0.get(url).send().await?.error_for_status()?;
        Ok(crate::answer_body::read(response).await?)
    }
}

impl<'c> AsyncHttpClient<'c> for Http {
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = self.0.execute(request).await?;
            let mut answer = openidconnect::http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let body = crate::answer_body::read(response).await?;
            Ok(answer.body(body)?)
        })
    }
}
