package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/stretchr/testify/require"
)

// gendurable schedules: the list, and pause, resume, trigger and remove of one schedule.
func TestSchedulesCommand(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	job := gendurable.Job[string]{Name: "report", Queue: "reports", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{job}})
	require.NoError(t, err)
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "nightly", Input: job.With("n"), Cron: "0 2 * * MON-FRI",
		TimeZone: "Europe/Berlin"}))
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "often", Input: job.With("o"), Every: 5 * time.Minute}))

	url := durabledbtest.URL(t)
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--database-url", url, "--schema", schema)...)
	}
	code, out, errOut := cli("schedules")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `nightly\s+report\s+0 2 \* \* MON-FRI Europe/Berlin\s+skip\s+\S+\s+-\s+-\s+0\s+0\s+active`, out)
	require.Regexp(t, `often\s+report\s+every 5m0s`, out)

	code, out, errOut = cli("schedules", "pause", "nightly")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `schedule "nightly" paused`)
	code, out, errOut = cli("schedules", "trigger", "nightly")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `schedule "nightly" fired: instance \d+`, out)
	code, out, errOut = cli("schedules", "--json")
	require.Equal(t, 0, code, errOut)
	var list []gendurable.ScheduleInfo
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 2)
	require.True(t, list[0].Paused)
	require.Equal(t, int64(1), list[0].Fired)
	require.NotNil(t, list[0].LastInstanceID)
	require.Equal(t, gendurable.StatusAvailable, list[0].LastStatus)

	code, out, errOut = cli("schedules", "resume", "nightly")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `schedule "nightly" resumed; next fire`)
	code, out, errOut = cli("schedules", "remove", "often")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `schedule "often" removed`)
	_, err = cl.GetSchedule(ctx, "often")
	require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"schedules", "pause"}, "usage: schedules"},
		{[]string{"schedules", "explode", "nightly"}, "usage: schedules"},
		{[]string{"schedules", "trigger", "nope"}, `unknown schedule: "nope"`},
	} {
		code, _, errOut := cli(tc.args...)
		require.Equal(t, 1, code, fmt.Sprint(tc.args))
		require.Contains(t, errOut, tc.want)
	}
}
