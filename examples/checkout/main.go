// Command checkout is an HTTP service on the await bridge. POST /checkouts starts a checkout
// workflow and answers with its receipt when it finishes within the request's wait, or 202
// Accepted with the instance id when it does not: the work goes on, and GET /checkouts/{id}
// (which awaits again) is the whole retry protocol. An Idempotency-Key header makes a repeated
// POST return the same checkout instead of starting another.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Checkout is the workflow's state.
type Checkout struct {
	Items int `json:"items"`
	// PaymentMS is how long the payment provider takes (a stand-in for a slow remote call).
	PaymentMS int    `json:"payment_ms,omitempty"`
	Reserved  bool   `json:"reserved,omitempty"`
	Receipt   string `json:"receipt,omitempty"`
}

var checkout = gendurable.FSM[Checkout]{
	Name:  "checkout",
	Start: "reserve",
	Steps: map[string]gendurable.StepFunc[Checkout]{
		"reserve": func(ctx *gendurable.Ctx, c Checkout) (gendurable.Outcome, error) {
			if c.Items <= 0 {
				return gendurable.Stop(errors.New("the cart is empty")), nil
			}
			c.Reserved = true
			return gendurable.Next("pay", c), nil
		},
		"pay": func(ctx *gendurable.Ctx, c Checkout) (gendurable.Outcome, error) {
			select {
			case <-time.After(time.Duration(c.PaymentMS) * time.Millisecond):
			case <-ctx.Done():
				return gendurable.Outcome{}, context.Cause(ctx)
			}
			c.Receipt = fmt.Sprintf("R-%d", ctx.ID)
			return gendurable.Done(c), nil
		},
	},
}

// Defaults and bounds of the ?wait= parameter.
const (
	defaultWait = 2 * time.Second
	maxWait     = 30 * time.Second
)

// reply is every response's body.
type reply struct {
	ID     int64           `json:"id,omitempty"`
	Status string          `json:"status"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Retry is where to ask again when the work is still going on.
	Retry string `json:"retry,omitempty"`
}

func newHandler(client *gendurable.Client) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /checkouts", func(w http.ResponseWriter, r *http.Request) {
		wait, ok := waitParam(w, r)
		if !ok {
			return
		}
		var c Checkout
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&c); err != nil {
			write(w, http.StatusBadRequest, reply{Status: "bad_request", Error: "the body is not a checkout: " + err.Error()})
			return
		}
		opts := &gendurable.InsertOpts{}
		if key := r.Header.Get("Idempotency-Key"); key != "" {
			// A repeated POST returns the checkout of the first, finished or not.
			opts.CorrelationKey = key
			opts.CorrelationScope = []gendurable.Status{gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled}
		}
		res, err := client.Insert(r.Context(), checkout.With(c), opts)
		if err != nil {
			write(w, http.StatusBadRequest, reply{Status: "bad_request", Error: err.Error()})
			return
		}
		respond(w, r, client, res.ID, wait)
	})
	mux.HandleFunc("GET /checkouts/{id}", func(w http.ResponseWriter, r *http.Request) {
		wait, ok := waitParam(w, r)
		if !ok {
			return
		}
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil || id <= 0 {
			write(w, http.StatusBadRequest, reply{Status: "bad_request", Error: "the id is not a positive number"})
			return
		}
		respond(w, r, client, id, wait)
	})
	return mux
}

// docs:begin await-respond
// respond holds the request until the checkout settles or wait passes, and maps the answer to
// HTTP: the row decides, never the wait.
func respond(w http.ResponseWriter, r *http.Request, client *gendurable.Client, id int64, wait time.Duration) {
	a, err := client.Await(r.Context(), id, wait, nil)
	if err != nil {
		write(w, http.StatusServiceUnavailable, reply{ID: id, Status: "error", Error: err.Error()})
		return
	}
	out := reply{ID: id, Status: string(a.Status)}
	switch a.Status {
	case gendurable.AwaitDone:
		out.Result = json.RawMessage(a.Instance.Result)
		write(w, http.StatusOK, out)
	case gendurable.AwaitFailed, gendurable.AwaitCancelled:
		out.Error = a.Err().Error()
		write(w, http.StatusUnprocessableEntity, out)
	case gendurable.AwaitNotFound:
		write(w, http.StatusNotFound, out)
	default: // busy, or parked on a signal: the id is the retry token
		out.Retry = fmt.Sprintf("/checkouts/%d", id)
		w.Header().Set("Location", out.Retry)
		write(w, http.StatusAccepted, out)
	}
}

// docs:end

func waitParam(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	s := r.URL.Query().Get("wait")
	if s == "" {
		return defaultWait, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > maxWait {
		write(w, http.StatusBadRequest, reply{Status: "bad_request",
			Error: fmt.Sprintf("wait=%q: a duration above 0 and at most %v, like 2s", s, maxWait)})
		return 0, false
	}
	return d, true
}

func write(w http.ResponseWriter, code int, body reply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// serve runs the service on addr until ctx ends.
func serve(ctx context.Context, databaseURL, schema, addr string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		return err
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Machine{checkout},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 20}},
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	srv := &http.Server{Addr: addr, Handler: newHandler(client), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("checkout: listening on %s", addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, url, "gendurable", addr); err != nil {
		log.Fatal(err)
	}
}
