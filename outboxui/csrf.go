package outboxui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrfCookie names the cookie whose signature every form carries; csrfField is the form
// field.
const (
	csrfCookie = "outboxui_csrf"
	csrfField  = "csrf"
)

// csrfToken returns the token of r's browser: the signature of its CSRF cookie with the
// handler's key, issuing the cookie when the browser has none. A page on another site can
// neither read the cookie nor compute the signature, so it cannot forge a form; the token
// is a second line behind http.CrossOriginProtection, for browsers that send neither
// Sec-Fetch-Site nor Origin.
func (u *ui) csrfToken(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 32 {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		c = &http.Cookie{
			Name: csrfCookie, Value: base64.RawURLEncoding.EncodeToString(b),
			Path: u.link("/"), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		}
		http.SetCookie(w, c)
		// Later reads of this request see it as the browser will send it.
		r.AddCookie(c)
	}
	return u.sign(c.Value)
}

func (u *ui) sign(v string) string {
	m := hmac.New(sha256.New, u.o.CSRFKey)
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether the POST r carries the token of its browser's cookie.
func (u *ui) checkCSRF(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 32 {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(u.sign(c.Value)))
}

// allowAction refuses a state change, answering for it, when the view is read-only or the
// form's token is wrong; it reports whether the action may go ahead.
func (u *ui) allowAction(w http.ResponseWriter, r *http.Request) bool {
	if u.o.ReadOnly {
		u.fail(w, r, http.StatusForbidden, "refused: this view is read-only. Nothing was changed.", nil)
		return false
	}
	if err := r.ParseForm(); err != nil {
		u.fail(w, r, http.StatusBadRequest, "the form could not be read. Nothing was changed.", err)
		return false
	}
	if !u.checkCSRF(r) {
		u.fail(w, r, http.StatusForbidden, "refused: the form's security token is missing or wrong (the page may be stale, "+
			"or was served by another replica with another key; reload it and try again). Nothing was changed.", nil)
		return false
	}
	return true
}
