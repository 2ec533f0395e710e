// Command dashboard is an application server that mounts gendurable's dashboard (package
// durableui) under /admin/durable/, behind its own login: admins may look, operators may also
// signal, retry and cancel. It works an approval workflow so that there is something to see.
//
//	DATABASE_URL=postgres://… ADMIN_PASSWORD=… OPERATOR_PASSWORD=… go run ./examples/dashboard
//
// Then open http://127.0.0.1:8080/admin/durable/ and log in as admin or operator.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durableui"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Expense is the workflow's state: an expense waits for an approval signal, then is paid.
type Expense struct {
	Amount   int    `json:"amount"`
	Approver string `json:"approver,omitempty"`
	Paid     bool   `json:"paid,omitempty"`
}

var expense = gendurable.FSM[Expense]{
	Name:  "expense",
	Start: "submit",
	Steps: map[string]gendurable.StepFunc[Expense]{
		"submit": func(ctx *gendurable.Ctx, e Expense) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"approve"}, "pay", e), nil
		},
		"pay": func(ctx *gendurable.Ctx, e Expense) (gendurable.Outcome, error) {
			for _, s := range ctx.Inbox {
				var by struct {
					By string `json:"by"`
				}
				if s.Name == "approve" && s.Decode(&by) == nil {
					e.Approver = by.By
				}
			}
			e.Paid = true
			return gendurable.Done(e), nil
		},
	},
}

// user is an account of the admin pages.
type user struct {
	password string
	operator bool // may act on instances, not only look at them
}

// docs:begin dashboard-embed
// adminRoutes mounts the dashboard under /admin/durable/ of the application's own server:
// looking needs an admin login (the application's middleware), acting needs an operator (the
// dashboard's Authorize hook, called for every signal, retry and cancel).
func adminRoutes(mux *http.ServeMux, client *gendurable.Client, users map[string]user) error {
	dashboard, err := durableui.New(client, &durableui.Options{
		Prefix: "/admin/durable/", // where it is mounted: every link and form starts with it
		Authorize: func(r *http.Request) error {
			if u, ok := login(r, users); !ok || !u.operator {
				return errors.New("only operators may signal, retry or cancel")
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	mux.Handle("/admin/durable/", requireLogin(users, dashboard))
	return nil
}

// docs:end

// login returns the user whose HTTP basic credentials the request carries.
func login(r *http.Request, users map[string]user) (user, bool) {
	name, password, ok := r.BasicAuth()
	u, known := users[name]
	if !ok || !known || u.password == "" {
		return user{}, false
	}
	got, want := sha256.Sum256([]byte(password)), sha256.Sum256([]byte(u.password))
	return u, subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// requireLogin lets only known users through to next.
func requireLogin(users map[string]user, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := login(r, users); !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="admin", charset="UTF-8"`)
			http.Error(w, "log in to see the admin pages", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func serve(ctx context.Context, databaseURL, schema, addr string, users map[string]user) error {
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
		Machines: []gendurable.Machine{expense},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 10}},
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
	for i := range 3 { // a few expenses waiting for an approval
		if _, err := client.Insert(ctx, expense.With(Expense{Amount: 100 * (i + 1)}), nil); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	if err := adminRoutes(mux, client, users); err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Printf("the dashboard is at http://%s/admin/durable/\n", addr)
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
	users := map[string]user{
		"admin":    {password: os.Getenv("ADMIN_PASSWORD")},
		"operator": {password: os.Getenv("OPERATOR_PASSWORD"), operator: true},
	}
	if users["admin"].password == "" && users["operator"].password == "" {
		log.Fatal("set ADMIN_PASSWORD and/or OPERATOR_PASSWORD: the admin pages need a login")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, url, "gendurable", "127.0.0.1:8080", users); err != nil {
		log.Fatal(err)
	}
}
