package outboxwebhook

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a webhook-timestamp may be from the receiver's clock, either
// way, for [Verify]: the five minutes that Standard Webhooks receivers commonly allow.
const DefaultTolerance = 5 * time.Minute

// ErrSignature marks a request that [Verify] refuses.
var ErrSignature = errors.New("webhook: signature verification failed")

// Verify checks a received webhook the way a Standard Webhooks receiver does: the
// webhook-id, webhook-timestamp and webhook-signature headers are present, the timestamp is
// within tolerance of now (DefaultTolerance when tolerance is 0), and one of the
// space-separated signatures is the "v1" signature of the id, timestamp and body under key,
// compared in constant time. body must be the raw request body, not re-encoded JSON. It is
// meant for receivers written in Go and for tests of them; errors match [ErrSignature].
func Verify(key []byte, h http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	id, ts, sigs := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: webhook-id, webhook-timestamp and webhook-signature are required", ErrSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: webhook-timestamp is not Unix seconds", ErrSignature)
	}
	at := time.Unix(sec, 0)
	if d := now.Sub(at); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: webhook-timestamp %s is more than %s from now", ErrSignature, at.UTC().Format(time.RFC3339), tolerance)
	}
	want := []byte(Sign(key, id, at, body))
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no signature matches", ErrSignature)
}
