//! One reading of a Kubernetes API error's HTTP status, used by every pass instead of
//! `s.code == 403` spelled at each call site.
//!
//! These go by the HTTP code, as every check they replace did. kube's own `Status::is_*` compare
//! the `reason` field only (kube-core 5 asks whether the *constant* is a known reason, so the code
//! fallback never applies), and would miss a bare 403 from a proxy, or count a create's 409
//! `AlreadyExists` as no conflict.

/// Status-code checks on [`kube::Error`]: true only for an API error with that code.
pub trait StatusCode {
    /// The API error's HTTP code, if the error is one.
    fn api_code(&self) -> Option<u16>;

    /// The API error's own message (the `Status` body's `message`), if the error is one.
    fn api_message(&self) -> Option<&str>;

    /// 400: the request was malformed (for instance a bad label selector).
    fn is_bad_request(&self) -> bool {
        self.api_code() == Some(400)
    }
    /// 401: the credentials were rejected.
    fn is_unauthorized(&self) -> bool {
        self.api_code() == Some(401)
    }
    /// 403: RBAC (or an admission webhook) refused the request.
    fn is_forbidden(&self) -> bool {
        self.api_code() == Some(403)
    }
    /// 404: the object (or the API) does not exist.
    fn is_not_found(&self) -> bool {
        self.api_code() == Some(404)
    }
    /// 409: a resourceVersion conflict, or a create meeting an existing name.
    fn is_conflict(&self) -> bool {
        self.api_code() == Some(409)
    }
    /// 422: the object failed validation.
    fn is_invalid(&self) -> bool {
        self.api_code() == Some(422)
    }
}

impl StatusCode for kube::Error {
    fn api_code(&self) -> Option<u16> {
        match self {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }

    fn api_message(&self) -> Option<&str> {
        match self {
            kube::Error::Api(s) => Some(&s.message),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StatusCode;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn goes_by_the_code_whatever_the_reason() {
        assert!(api(403, "").is_forbidden());
        assert!(api(409, "AlreadyExists").is_conflict());
        assert!(api(404, "NotFound").is_not_found());
        assert!(api(422, "Invalid").is_invalid());
        assert!(api(400, "BadRequest").is_bad_request());
        assert!(api(401, "Unauthorized").is_unauthorized());
        assert!(!api(404, "NotFound").is_forbidden());
        let not_api = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(not_api.api_code(), None);
        assert!(!not_api.is_not_found());
    }
}
