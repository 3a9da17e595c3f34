// The template globals (see globals.h).
#include "common/jinja/globals.h"

#include <cstdio>

#include "common/jinja/budget.h"
#include "common/jinja/python_format.h"

namespace tandem::jinja {
namespace {

const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                         "July",    "August",   "September", "October", "November", "December"};
const char* kDays[] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                       "Thursday", "Friday", "Saturday"};

// Copies a dict's items into `into`, whose keys are then unique as theirs.
void copyItems(ValueDict& into, const ValueDict& from) {
  if (into.items.empty()) {
    // Nothing to replace: no key-by-key search.
    reserveBytes(saturatingMul(from.items.size(), sizeof(std::pair<Value, Value>)));
    chargeSteps(from.items.size());
    into.items = from.items;
    return;
  }
  for (const auto& [k, v] : from.items) into.set(k, v);
}

std::string strftime(const std::string& format, const std::tm& tm) {
  // No directive prints more than 5 bytes per byte of the format ("%B").
  reserveString(saturatingMul(format.size(), 5));
  std::string out;
  char buf[32];
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    char c = format[++i];
    switch (c) {
      case 'Y':
        std::snprintf(buf, sizeof(buf), "%d", tm.tm_year + 1900);
        break;
      case 'y':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_year % 100);
        break;
      case 'm':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_mon + 1);
        break;
      case 'd':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_mday);
        break;
      case 'e':
        std::snprintf(buf, sizeof(buf), "%2d", tm.tm_mday);
        break;
      case '-':
        if (i + 1 < format.size() && format[i + 1] == 'd') {
          ++i;
          std::snprintf(buf, sizeof(buf), "%d", tm.tm_mday);
        } else {
          std::snprintf(buf, sizeof(buf), "%%-");
        }
        break;
      case 'H':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_hour);
        break;
      case 'I':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12);
        break;
      case 'M':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_min);
        break;
      case 'S':
        std::snprintf(buf, sizeof(buf), "%02d", tm.tm_sec);
        break;
      case 'p':
        std::snprintf(buf, sizeof(buf), "%s", tm.tm_hour < 12 ? "AM" : "PM");
        break;
      case 'j':
        std::snprintf(buf, sizeof(buf), "%03d", tm.tm_yday + 1);
        break;
      case 'b':
        std::snprintf(buf, sizeof(buf), "%.3s", kMonths[tm.tm_mon]);
        break;
      case 'B':
        std::snprintf(buf, sizeof(buf), "%s", kMonths[tm.tm_mon]);
        break;
      case 'a':
        std::snprintf(buf, sizeof(buf), "%.3s", kDays[tm.tm_wday]);
        break;
      case 'A':
        std::snprintf(buf, sizeof(buf), "%s", kDays[tm.tm_wday]);
        break;
      case 'w':
        std::snprintf(buf, sizeof(buf), "%d", tm.tm_wday);
        break;
      case '%':
        std::snprintf(buf, sizeof(buf), "%%");
        break;
      default:
        std::snprintf(buf, sizeof(buf), "%%%c", c);
    }
    out += buf;
  }
  return out;
}

}  // namespace

void installGlobals(Scope& scope) {
  scope.set("raise_exception",
            Value::callable("raise_exception", [](Evaluator&, const CallArgs& args) -> Value {
              const Value* msg = args.get(0, "message");
              throw RenderFailure(msg == nullptr ? "" : pyStr(*msg), true);
            }));
  scope.set("strftime_now",
            Value::callable("strftime_now", [](Evaluator& ev, const CallArgs& args) {
              const Value* fmt = args.get(0, "format");
              if (fmt == nullptr || !fmt->isString()) {
                throw RenderFailure("strftime_now() needs a format string");
              }
              return Value(strftime(fmt->asString(), ev.now()));
            }));
  scope.set("range", Value::callable("range", [](Evaluator& ev, const CallArgs& args) {
              int64_t start = 0;
              int64_t stop = 0;
              int64_t step = 1;
              for (const auto& a : args.positional) {
                if (!a.isInt() && !a.isBool()) {
                  throw RenderFailure("'" + a.typeName() +
                                      "' object cannot be interpreted as an integer");
                }
              }
              if (args.positional.size() == 1) {
                stop = args.positional[0].asInt();
              } else if (args.positional.size() >= 2) {
                start = args.positional[0].asInt();
                stop = args.positional[1].asInt();
                if (args.positional.size() >= 3) step = args.positional[2].asInt();
              } else {
                throw RenderFailure("range expected at least 1 argument, got 0");
              }
              if (step == 0) throw RenderFailure("range() arg 3 must not be zero");
              __int128 span = step > 0 ? static_cast<__int128>(stop) - start
                                       : static_cast<__int128>(start) - stop;
              __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
              __int128 count = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
              if (count > static_cast<__int128>(ev.options().limits.max_loop_iterations)) {
                failLimit("range of more than " +
                          std::to_string(ev.options().limits.max_loop_iterations) +
                          " items (limit max_loop_iterations)");
              }
              reserveBytes(saturatingMul(static_cast<size_t>(count), sizeof(Value)));
              chargeSteps(static_cast<uint64_t>(count));
              ValueList out;
              out.reserve(static_cast<size_t>(count));
              // Counted, not compared with stop: the last step may pass int64.
              for (__int128 k = 0; k < count; ++k) {
                out.emplace_back(static_cast<int64_t>(start + k * step));
              }
              return Value::list(std::move(out));
            }));
  scope.set("namespace", Value::callable("namespace", [](Evaluator& ev, const CallArgs& args) {
              size_t attrs = args.keyword.size();
              for (const auto& a : args.positional) {
                if (!a.isDict())
                  throw RenderFailure("namespace() positional argument must be a dict");
                attrs += a.asDict().items.size();
              }
              auto ns = AttrObject::make("Namespace", attrs);
              ev.track(ns);
              for (const auto& a : args.positional) copyItems(ns->attrs, a.asDict());
              for (const auto& [k, v] : args.keyword) ns->attrs.set(Value(k), v);
              return Value::object(ns);
            }));
  scope.set("dict", Value::callable("dict", [](Evaluator&, const CallArgs& args) {
              ValueDict d;
              for (const auto& a : args.positional) {
                if (!a.isDict()) throw RenderFailure("dict() positional argument must be a dict");
                copyItems(d, a.asDict());
              }
              for (const auto& [k, v] : args.keyword) d.set(Value(k), v);
              return Value::dict(std::move(d));
            }));
}

}  // namespace tandem::jinja
