package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// execute runs the parsed command o and prints its result to stdout.
func execute(ctx context.Context, o options, stdout io.Writer) error {
	if o.keyring != "" {
		c, err := loadKeyring(o.keyring)
		if err != nil {
			return err
		}
		o.codec = c
	}
	a, closeConns, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer closeConns()
	switch o.cmd {
	case "inspect":
		info, err := a.Inspect(ctx, o.key, o.body)
		if err != nil {
			if o.codec != nil && errors.Is(err, idempotency.ErrCodec) {
				return fmt.Errorf("%w (the -keyring given cannot open this record: it needs the key it was sealed with)", err)
			}
			return err
		}
		return emit(stdout, o.json, keyJSON(info, o.body), func(w io.Writer) { printInfo(w, info, o.body) })
	case "forget":
		info, err := a.Forget(ctx, o.key)
		if err != nil {
			return err
		}
		return emit(stdout, o.json, forgetJSON{Forgotten: keyJSON(info, true), Next: nextRuns}, func(w io.Writer) {
			printInfo(w, info, false)
			fmt.Fprintf(w, "forgotten: %s\n", nextRuns)
		})
	case "list":
		page, err := a.List(ctx, o.list)
		if err != nil {
			return err
		}
		return emit(stdout, o.json, listJSON(page), func(w io.Writer) { printList(w, page) })
	case "stats":
		st, err := a.Stats(ctx)
		if err != nil {
			return err
		}
		return emit(stdout, o.json, statsJSON(st), func(w io.Writer) { printStats(w, st) })
	case "purge":
		return purge(ctx, a, o, stdout)
	}
	return usagef("unknown command %q", o.cmd)
}

// nextRuns is what forget tells the operator.
const nextRuns = "the next request with this key will run the operation again, as for a new key"

func purge(ctx context.Context, a admin, o options, stdout io.Writer) error {
	if o.dryRun {
		st, err := a.Stats(ctx)
		if err != nil {
			return err
		}
		return emit(stdout, o.json, purgeJSON{DryRun: true, Expired: &st.Expired}, func(w io.Writer) {
			fmt.Fprintf(w, "expired: %d (a purge would delete them; nothing was deleted)\n", st.Expired)
		})
	}
	n, err := a.Purge(ctx)
	if err != nil {
		return fmt.Errorf("after deleting %d expired records: %w", n, err)
	}
	return emit(stdout, o.json, purgeJSON{Deleted: int64(n)}, func(w io.Writer) {
		fmt.Fprintf(w, "deleted: %d expired records\n", n)
	})
}

// emit writes v as one JSON object, or the human text of text.
func emit(w io.Writer, asJSON bool, v any, text func(io.Writer)) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(w)
	return nil
}

// timeText formats t in UTC to the millisecond; "-" for the zero time and
// "never" for backend.MaxExpiry.
func timeText(t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case !t.Before(backend.MaxExpiry().Truncate(time.Millisecond)):
		return "never"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// printInfo prints one key, one field a line; withBody: inspect -body.
func printInfo(w io.Writer, info *idempotency.KeyInfo, withBody bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	line("key", info.Key.String())
	line("state", info.State.String())
	if info.Operation != "" {
		line("operation", info.Operation)
		line("step", info.Step)
		line("tries", strconv.Itoa(info.Tries))
		line("failure", orDash(info.Failure))
	}
	line("fingerprint", orDash(info.Fingerprint))
	if info.State == idempotency.KeyCompleted || info.State == idempotency.KeyExpired {
		line("status", strconv.Itoa(info.Status))
		for _, name := range slices.Sorted(maps.Keys(info.Header)) {
			for _, v := range info.Header[name] {
				line("header", name+": "+v)
			}
		}
		line("body size", strconv.Itoa(info.BodyLen)+" bytes")
	}
	line("created", timeText(info.CreatedAt))
	line("expires", timeText(info.ExpiresAt))
	if !info.LeaseEnds.IsZero() {
		line("lease ends", timeText(info.LeaseEnds))
	}
	if info.Sealed {
		line("sealed", "yes")
	}
	_ = tw.Flush()
	switch {
	case info.Body != nil:
		fmt.Fprintf(w, "body:\n%s\n", info.Body)
	case withBody && info.Sealed && info.BodyLen > 0:
		fmt.Fprintf(w, "body: %s\n", sealedBody)
	}
}

// sealedBody is what inspect -body prints for a sealed body it cannot open.
const sealedBody = "sealed (give -keyring to open it)"

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printList prints a page as a table, then the cursor of the next page.
func printList(w io.Writer, page idempotency.KeyPage) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tID\tSTEP\tTRIES\tSTATUS\tBODY\tCREATED\tEXPIRES")
	for _, k := range page.Keys {
		step, tries, status := "-", "-", "-"
		if k.Operation != "" {
			step, tries = k.Operation+"/"+k.Step, strconv.Itoa(k.Tries)
		}
		if k.Status != 0 {
			status = strconv.Itoa(k.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.State, k.Key.ID, step, tries, status, k.BodyLen, timeText(k.CreatedAt), timeText(k.ExpiresAt))
	}
	_ = tw.Flush()
	if page.Next != nil {
		fmt.Fprintf(w, "next page: -after %s\n", formatCursor(page.Next))
	} else {
		fmt.Fprintln(w, "last page")
	}
}

func printStats(w io.Writer, st idempotency.Stats) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, f := range []struct {
		name string
		n    int64
	}{{"in_progress", st.InProgress}, {"unfinished", st.Unfinished}, {"failing", st.Failing}, {"completed", st.Completed}, {"expired", st.Expired}, {"body bytes", st.BodyBytes}} {
		fmt.Fprintf(tw, "%s:\t%d\n", f.name, f.n)
	}
	fmt.Fprintf(tw, "oldest unfinished:\t%s\n", timeText(st.OldestUnfinished))
	_ = tw.Flush()
}

// keyInfoJSON is a key in -json output.
type keyInfoJSON struct {
	Scope       string              `json:"scope"`
	ID          string              `json:"id"`
	KeyHash     string              `json:"key_hash"`
	State       string              `json:"state"`
	Operation   string              `json:"operation,omitempty"`
	Step        string              `json:"step,omitempty"`
	Tries       int                 `json:"tries,omitempty"`
	Failure     string              `json:"failure,omitempty"`
	Fingerprint string              `json:"fingerprint,omitempty"`
	Status      int                 `json:"status,omitempty"`
	Header      map[string][]string `json:"header,omitempty"`
	BodyLen     int                 `json:"body_len"`
	Body        []byte              `json:"body,omitempty"`
	Sealed      bool                `json:"sealed,omitempty"`
	// BodySealed is inspect -body's note for a sealed body it could not
	// open (no -keyring).
	BodySealed string     `json:"body_sealed,omitempty"`
	Created    *time.Time `json:"created,omitempty"`
	Expires    *time.Time `json:"expires,omitempty"`
	LeaseEnds  *time.Time `json:"lease_ends,omitempty"`
}

func keyJSON(info *idempotency.KeyInfo, withBody bool) keyInfoJSON {
	j := keyInfoJSON{Scope: info.Key.Scope, ID: info.Key.ID, KeyHash: info.Key.Hash(), State: info.State.String(),
		Operation: info.Operation, Step: info.Step, Tries: info.Tries, Failure: info.Failure, Fingerprint: info.Fingerprint,
		Status: info.Status, Header: info.Header, BodyLen: info.BodyLen, Created: timeJSON(info.CreatedAt),
		Expires: timeJSON(info.ExpiresAt), LeaseEnds: timeJSON(info.LeaseEnds), Sealed: info.Sealed}
	if withBody {
		j.Body = info.Body
		if info.Sealed && info.Body == nil && info.BodyLen > 0 {
			j.BodySealed = sealedBody
		}
	}
	return j
}

func timeJSON(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// forgetJSON is forget's -json output.
type forgetJSON struct {
	Forgotten keyInfoJSON `json:"forgotten"`
	Next      string      `json:"next"`
}

// pageJSON is list's -json output.
type pageJSON struct {
	Keys []keyInfoJSON `json:"keys"`
	Next string        `json:"next,omitempty"`
}

func listJSON(page idempotency.KeyPage) pageJSON {
	p := pageJSON{Keys: []keyInfoJSON{}, Next: formatCursor(page.Next)}
	for i := range page.Keys {
		p.Keys = append(p.Keys, keyJSON(&page.Keys[i], false))
	}
	return p
}

// statsOut is stats' -json output.
type statsOut struct {
	InProgress       int64      `json:"in_progress"`
	Unfinished       int64      `json:"unfinished"`
	Failing          int64      `json:"failing"`
	Completed        int64      `json:"completed"`
	Expired          int64      `json:"expired"`
	BodyBytes        int64      `json:"body_bytes"`
	OldestUnfinished *time.Time `json:"oldest_unfinished,omitempty"`
}

func statsJSON(st idempotency.Stats) statsOut {
	return statsOut{InProgress: st.InProgress, Unfinished: st.Unfinished, Failing: st.Failing, Completed: st.Completed,
		Expired: st.Expired, BodyBytes: st.BodyBytes, OldestUnfinished: timeJSON(st.OldestUnfinished)}
}

// purgeJSON is purge's -json output: Expired only for -dry-run.
type purgeJSON struct {
	DryRun  bool   `json:"dry_run"`
	Expired *int64 `json:"expired,omitempty"`
	Deleted int64  `json:"deleted"`
}
