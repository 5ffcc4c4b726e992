package outboxui

import (
	"fmt"
	"net/url"
	"strconv"
)

// Notices are what a page says after an action redirected to it. The query carries a code
// and counts, never text, so that a crafted link cannot make the page say anything else.
var notices = map[string]string{
	"replayed":  "Replayed %d dead letters: they are pending again.",
	"discarded": "Discarded %d dead letters.",
}

func notice(q url.Values) string {
	format, ok := notices[q.Get("done")]
	if !ok {
		return ""
	}
	n, _ := strconv.ParseInt(q.Get("n"), 10, 64)
	msg := fmt.Sprintf(format, n)
	if skipped, _ := strconv.ParseInt(q.Get("skipped"), 10, 64); skipped > 0 {
		msg += fmt.Sprintf(" %d were no longer dead and were left as they are.", skipped)
	}
	return msg
}

// doneQuery is the query that makes the next page say what an action did.
func doneQuery(code string, n, skipped int) url.Values {
	v := url.Values{"done": {code}, "n": {strconv.Itoa(n)}}
	if skipped > 0 {
		v.Set("skipped", strconv.Itoa(skipped))
	}
	return v
}
