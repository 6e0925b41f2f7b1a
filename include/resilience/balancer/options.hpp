// SPDX-License-Identifier: MIT
/// \file balancer/options.hpp
/// What a `balancer` is told: how it picks an endpoint (`balance_pick`), how it ramps up a new one
/// (slow start), when it ejects an outlier (`outlier_ejection_options`), and the payload of its
/// `on_ejection` callback (`ejection_event`). The checks are the balancer's (balancer/balancer.hpp).
#pragma once

#include "../classifier.hpp"
#include "../telemetry_event.hpp" // telemetry_listener

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace resilience::inline v0_2 {

/// How a balancer picks among the endpoints it may use.
enum class balance_pick : unsigned char {
    /// Power of two choices: two endpoints drawn at random, the one with the lower load taken, where
    /// the load is the endpoint's peak-EWMA latency times its calls in flight plus one (as Finagle and
    /// tower's `p2c` over `PeakEwma` do). Steers away from a slow or busy endpoint at once, without
    /// herding every caller onto the one endpoint that looks best.
    least_loaded,
    /// Each endpoint in turn, whatever its latency.
    round_robin,
    /// One endpoint drawn at random, whatever its latency.
    random,
};

/// "least_loaded", "round_robin" or "random": a static string, for logs.
constexpr const char* to_string(balance_pick p) noexcept {
    switch (p) {
    case balance_pick::least_loaded:
        return "least_loaded";
    case balance_pick::round_robin:
        return "round_robin";
    case balance_pick::random:
        return "random";
    }
    return "unknown";
}

/// When a balancer stops sending calls to an endpoint for a while. Names and defaults follow Envoy's
/// outlier detection (https://www.envoyproxy.io/docs/envoy/latest/api-v3/config/cluster/v3/outlier_detection.proto)
/// and gRPC's (gRFC A50), for failures as the balancer's classifier judges them (Envoy counts 5xx).
/// An ejected endpoint gets no new call for `base_ejection_time` times the number of times it was
/// ejected (at most `max_ejection_time`), then comes back through slow start.
struct outlier_ejection_options {
    /// Ejects an endpoint whose last this-many calls failed, at the failure that makes the run. Zero:
    /// never for consecutive failures. Not negative.
    int consecutive_failures = 5;
    /// How often success rates are compared, and how often an endpoint that stayed in has one ejection
    /// forgiven. The intervals are counted from the balancer's construction; the comparison is made by
    /// the first call at or after an interval's end, over the calls that ended since the one before.
    /// Positive.
    std::chrono::nanoseconds interval = std::chrono::seconds{10};
    /// How long the first ejection lasts; the n-th lasts n times as long. Positive.
    std::chrono::nanoseconds base_ejection_time = std::chrono::seconds{30};
    /// The longest an ejection lasts (at least `base_ejection_time`, which it is raised to). Positive.
    std::chrono::nanoseconds max_ejection_time = std::chrono::seconds{300};
    /// No endpoint is ejected while this share of the set (in percent) is ejected already; at least one
    /// endpoint may always be. In [0, 100].
    double max_ejection_percent = 10.0;
    /// Ejects, at an interval's end, an endpoint whose success rate over the interval is below the mean
    /// of the endpoints' success rates minus this many standard deviations. Zero or less: never for
    /// the success rate. Envoy's `success_rate_stdev_factor` is this times 1000.
    double success_rate_stdev_factor = 1.9;
    /// The success rate is compared only among endpoints with at least this many calls in the
    /// interval, and only when at least `success_rate_minimum_hosts` of them have. Positive.
    int success_rate_request_volume = 100;
    /// See `success_rate_request_volume`. Positive.
    int success_rate_minimum_hosts = 5;
    /// When fewer than this share (in percent) of the endpoints are not ejected, the balancer is in
    /// panic and picks among all of them, ejected or not (Envoy's `healthy_panic_threshold`). In
    /// [0, 100]; zero: never in panic.
    double panic_threshold_percent = 50.0;
};

/// Why an endpoint left or came back: what an `on_ejection` callback is told. Refers to the
/// balancer's name and the endpoint's text: valid only during the callback.
class ejection_event {
public:
    enum class cause : unsigned char { consecutive_failures, success_rate, returned };
    ejection_event(std::string_view policy_name, std::string_view endpoint, cause why, int times_ejected,
                   std::chrono::nanoseconds duration) noexcept
        : name_(policy_name), endpoint_(endpoint), why_(why), times_(times_ejected), duration_(duration) {}
    /// The balancer's `name` option.
    [[nodiscard]] std::string_view policy_name() const noexcept { return name_; }
    /// The endpoint as text, when its type converts to `std::string_view` (else empty).
    [[nodiscard]] std::string_view endpoint() const noexcept { return endpoint_; }
    /// Ejected for consecutive failures or for its success rate, or `returned` (its ejection is over).
    [[nodiscard]] cause reason() const noexcept { return why_; }
    [[nodiscard]] bool returned() const noexcept { return why_ == cause::returned; }
    /// How many times the endpoint has been ejected, this ejection included (not lowered by a return).
    [[nodiscard]] int times_ejected() const noexcept { return times_; }
    /// How long this ejection lasts (zero for a return).
    [[nodiscard]] std::chrono::nanoseconds duration() const noexcept { return duration_; }

private:
    std::string_view name_;
    std::string_view endpoint_;
    cause why_;
    int times_;
    std::chrono::nanoseconds duration_;
};

/// "consecutive_failures", "success_rate" or "returned": a static string, for logs.
constexpr const char* to_string(ejection_event::cause c) noexcept {
    switch (c) {
    case ejection_event::cause::consecutive_failures:
        return "consecutive_failures";
    case ejection_event::cause::success_rate:
        return "success_rate";
    case ejection_event::cause::returned:
        return "returned";
    }
    return "unknown";
}

struct balancer_options {
    /// Names the balancer in its errors, events and messages. Empty: unnamed.
    std::string name{};
    /// How an endpoint is picked for each attempt.
    balance_pick pick = balance_pick::least_loaded;
    /// `least_loaded`: how fast a latency estimate forgets. A call slower than the estimate raises it
    /// at once (the "peak"); a faster one, and time without calls, lower it with this time constant.
    /// Positive. An estimate lies between 1 ns and 2^40 ns (about 18 minutes): a shorter or longer
    /// call, penalty or `initial_latency` counts as the nearer bound.
    std::chrono::nanoseconds decay_time = std::chrono::seconds{10};
    /// `least_loaded`: the latency an endpoint is taken to have before its first call ends. Positive.
    std::chrono::nanoseconds initial_latency = std::chrono::milliseconds{30};
    /// `least_loaded`: a failure (as `should_handle` judges) counts as taking at least this long, so
    /// that an endpoint failing fast does not look like the fastest one and draw the calls. Zero (the
    /// default, as tower and Finagle count it): a failure counts as what it took. A penalty also gives
    /// up the calls such an endpoint still answers (examples/replicas.cpp: the fleet needs them), and
    /// an endpoint that fails every call is ejected anyway. Not negative.
    std::chrono::nanoseconds failure_penalty{};
    /// A retry or a hedge's extra attempt of one call goes to an endpoint the call has not tried yet
    /// when one that may be picked is left (Envoy's `previous_hosts` predicate).
    bool avoid_tried = true;
    /// An endpoint added to the set, or back from an ejection, takes a share of the calls that grows
    /// linearly over this window, from `slow_start_min_weight` of its fair share to all of it. Zero (the
    /// default, as Envoy's): at once. Not negative. The endpoints a balancer is built with start at once.
    std::chrono::nanoseconds slow_start_window{};
    /// The share an endpoint starts slow start with, of its fair share. In (0, 1].
    double slow_start_min_weight = 0.1;
    /// When an endpoint is ejected, and when it comes back; empty: never.
    std::optional<outlier_ejection_options> outlier_ejection = outlier_ejection_options{};
    /// Which outcomes are failures, for ejection and for the failure penalty. Empty: every failure but
    /// a cancellation, and a returned value holding an error.
    classifier should_handle{};
    /// Called when an endpoint is ejected and when it comes back, on the thread of the call that saw
    /// it. What it throws is dropped (the call it happens in is not the endpoint's fault).
    std::function<void(const ejection_event&)> on_ejection{};
    /// Hears an `ejection` for every ejection and every return. Empty: none.
    telemetry_listener telemetry{};
};

} // namespace resilience
