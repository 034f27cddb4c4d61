"""Writes the hand-made XNLI / MultiNLI format fixtures in this folder (see SOURCES.md).

The sentences are composed for these tests (not taken from XNLI or MultiNLI); the files follow
the published layouts exactly: XNLI-1.0 ``xnli.{dev,test}.tsv``, XNLI-MT-1.0
``multinli/multinli.train.<lang>.tsv`` and MultiNLI 1.0 ``multinli_1.0_*.jsonl``.
Run: ``python tests/data/xnli/make_fixtures.py`` (rewrites the files byte-identically).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELS = ("entailment", "neutral", "contradiction")

# Per language: dev premise + (entailment, neutral, contradiction) hypotheses, then two test premises with theirs.
XNLI = {
    "en": [("The museum opens at nine in the morning.", "The museum is open in the morning.", "The museum is free on Sundays.", "The museum never opens before noon."),
           ("My brother bought a red bicycle last week.", "My brother has a bicycle.", "My brother rides his bicycle to work.", "My brother has never owned a bicycle."),
           ("It rained all day, so we stayed at home.", "We did not go out.", "We watched a film at home.", "The weather was sunny all day.")],
    "fr": [("Le musée ouvre à neuf heures du matin.", "Le musée est ouvert le matin.", "Le musée est gratuit le dimanche.", "Le musée n'ouvre jamais avant midi."),
           ("Mon frère a acheté un vélo rouge la semaine dernière.", "Mon frère a un vélo.", "Mon frère va au travail à vélo.", "Mon frère n'a jamais eu de vélo."),
           ("Il a plu toute la journée, alors nous sommes restés à la maison.", "Nous ne sommes pas sortis.", "Nous avons regardé un film à la maison.", "Il a fait beau toute la journée.")],
    "es": [("El museo abre a las nueve de la mañana.", "El museo está abierto por la mañana.", "El museo es gratuito los domingos.", "El museo nunca abre antes del mediodía."),
           ("Mi hermano compró una bicicleta roja la semana pasada.", "Mi hermano tiene una bicicleta.", "Mi hermano va al trabajo en bicicleta.", "Mi hermano nunca ha tenido una bicicleta."),
           ("Llovió todo el día, así que nos quedamos en casa.", "No salimos.", "Vimos una película en casa.", "Hizo sol todo el día.")],
    "de": [("Das Museum öffnet um neun Uhr morgens.", "Das Museum ist am Morgen geöffnet.", "Der Eintritt in das Museum ist sonntags frei.", "Das Museum öffnet nie vor Mittag."),
           ("Mein Bruder hat letzte Woche ein rotes Fahrrad gekauft.", "Mein Bruder hat ein Fahrrad.", "Mein Bruder fährt mit dem Fahrrad zur Arbeit.", "Mein Bruder hatte nie ein Fahrrad."),
           ("Es hat den ganzen Tag geregnet, also sind wir zu Hause geblieben.", "Wir sind nicht ausgegangen.", "Wir haben zu Hause einen Film gesehen.", "Das Wetter war den ganzen Tag sonnig.")],
    "el": [("Το μουσείο ανοίγει στις εννέα το πρωί.", "Το μουσείο είναι ανοιχτό το πρωί.", "Η είσοδος στο μουσείο είναι δωρεάν την Κυριακή.", "Το μουσείο δεν ανοίγει ποτέ πριν από το μεσημέρι."),
           ("Ο αδελφός μου αγόρασε ένα κόκκινο ποδήλατο την περασμένη εβδομάδα.", "Ο αδελφός μου έχει ποδήλατο.", "Ο αδελφός μου πηγαίνει στη δουλειά με το ποδήλατο.", "Ο αδελφός μου δεν είχε ποτέ ποδήλατο."),
           ("Έβρεχε όλη μέρα, οπότε μείναμε στο σπίτι.", "Δεν βγήκαμε έξω.", "Είδαμε μια ταινία στο σπίτι.", "Ο καιρός ήταν ηλιόλουστος όλη μέρα.")],
    "bg": [("Музеят отваря в девет часа сутринта.", "Музеят е отворен сутрин.", "Входът в музея е безплатен в неделя.", "Музеят никога не отваря преди обяд."),
           ("Брат ми купи червен велосипед миналата седмица.", "Брат ми има велосипед.", "Брат ми ходи на работа с велосипед.", "Брат ми никога не е имал велосипед."),
           ("Валя цял ден, затова останахме вкъщи.", "Не излязохме.", "Гледахме филм вкъщи.", "Времето беше слънчево през целия ден.")],
    "ru": [("Музей открывается в девять часов утра.", "Утром музей открыт.", "По воскресеньям вход в музей бесплатный.", "Музей никогда не открывается раньше полудня."),
           ("На прошлой неделе мой брат купил красный велосипед.", "У моего брата есть велосипед.", "Мой брат ездит на работу на велосипеде.", "У моего брата никогда не было велосипеда."),
           ("Весь день шёл дождь, поэтому мы остались дома.", "Мы никуда не выходили.", "Мы смотрели фильм дома.", "Весь день было солнечно.")],
    "tr": [("Müze sabah dokuzda açılıyor.", "Müze sabahları açık.", "Müze pazar günleri ücretsiz.", "Müze asla öğleden önce açılmaz."),
           ("Kardeşim geçen hafta kırmızı bir bisiklet aldı.", "Kardeşimin bir bisikleti var.", "Kardeşim işe bisikletle gidiyor.", "Kardeşimin hiç bisikleti olmadı."),
           ("Bütün gün yağmur yağdı, bu yüzden evde kaldık.", "Dışarı çıkmadık.", "Evde bir film izledik.", "Hava bütün gün güneşliydi.")],
    "ar": [("يفتح المتحف في الساعة التاسعة صباحا.", "المتحف مفتوح في الصباح.", "الدخول إلى المتحف مجاني يوم الأحد.", "لا يفتح المتحف أبدا قبل الظهر."),
           ("اشترى أخي دراجة حمراء الأسبوع الماضي.", "لدى أخي دراجة.", "يذهب أخي إلى العمل بالدراجة.", "لم يملك أخي دراجة قط."),
           ("أمطرت طوال اليوم، لذلك بقينا في المنزل.", "لم نخرج.", "شاهدنا فيلما في المنزل.", "كان الطقس مشمسا طوال اليوم.")],
    "vi": [("Bảo tàng mở cửa lúc chín giờ sáng.", "Bảo tàng mở cửa vào buổi sáng.", "Bảo tàng miễn phí vào ngày Chủ nhật.", "Bảo tàng không bao giờ mở cửa trước buổi trưa."),
           ("Anh trai tôi đã mua một chiếc xe đạp màu đỏ vào tuần trước.", "Anh trai tôi có một chiếc xe đạp.", "Anh trai tôi đi làm bằng xe đạp.", "Anh trai tôi chưa bao giờ có xe đạp."),
           ("Trời mưa cả ngày nên chúng tôi ở nhà.", "Chúng tôi đã không ra ngoài.", "Chúng tôi đã xem một bộ phim ở nhà.", "Trời nắng cả ngày.")],
    "th": [("พิพิธภัณฑ์เปิดเวลาเก้าโมงเช้า", "พิพิธภัณฑ์เปิดในตอนเช้า", "พิพิธภัณฑ์เข้าชมฟรีในวันอาทิตย์", "พิพิธภัณฑ์ไม่เคยเปิดก่อนเที่ยง"),
           ("พี่ชายของฉันซื้อจักรยานสีแดงเมื่อสัปดาห์ที่แล้ว", "พี่ชายของฉันมีจักรยาน", "พี่ชายของฉันขี่จักรยานไปทำงาน", "พี่ชายของฉันไม่เคยมีจักรยาน"),
           ("ฝนตกทั้งวัน เราจึงอยู่บ้าน", "เราไม่ได้ออกไปข้างนอก", "เราดูภาพยนตร์ที่บ้าน", "อากาศแจ่มใสทั้งวัน")],
    "zh": [("博物馆早上九点开门。", "博物馆上午开放。", "博物馆星期天免费参观。", "博物馆从来不在中午之前开门。"),
           ("我哥哥上周买了一辆红色的自行车。", "我哥哥有一辆自行车。", "我哥哥骑自行车上班。", "我哥哥从来没有过自行车。"),
           ("下了一整天的雨，所以我们待在家里。", "我们没有出门。", "我们在家看了一部电影。", "一整天都是晴天。")],
    "hi": [("संग्रहालय सुबह नौ बजे खुलता है।", "संग्रहालय सुबह खुला रहता है।", "रविवार को संग्रहालय में प्रवेश निःशुल्क है।", "संग्रहालय दोपहर से पहले कभी नहीं खुलता।"),
           ("मेरे भाई ने पिछले हफ्ते एक लाल साइकिल खरीदी।", "मेरे भाई के पास एक साइकिल है।", "मेरा भाई साइकिल से काम पर जाता है।", "मेरे भाई के पास कभी साइकिल नहीं थी।"),
           ("पूरे दिन बारिश हुई, इसलिए हम घर पर रहे।", "हम बाहर नहीं गए।", "हमने घर पर एक फिल्म देखी।", "पूरे दिन धूप खिली रही।")],
    "sw": [("Jumba la makumbusho hufunguliwa saa tatu asubuhi.", "Jumba la makumbusho liko wazi asubuhi.", "Kuingia katika jumba la makumbusho ni bure siku ya Jumapili.", "Jumba la makumbusho halifunguliwi kamwe kabla ya adhuhuri."),
           ("Kaka yangu alinunua baiskeli nyekundu wiki iliyopita.", "Kaka yangu ana baiskeli.", "Kaka yangu huenda kazini kwa baiskeli.", "Kaka yangu hajawahi kuwa na baiskeli."),
           ("Mvua ilinyesha siku nzima, kwa hiyo tulikaa nyumbani.", "Hatukutoka nje.", "Tulitazama filamu nyumbani.", "Hali ya hewa ilikuwa ya jua siku nzima.")],
    "ur": [("عجائب گھر صبح نو بجے کھلتا ہے۔", "عجائب گھر صبح کے وقت کھلا ہوتا ہے۔", "اتوار کو عجائب گھر میں داخلہ مفت ہے۔", "عجائب گھر دوپہر سے پہلے کبھی نہیں کھلتا۔"),
           ("میرے بھائی نے پچھلے ہفتے ایک سرخ سائیکل خریدی۔", "میرے بھائی کے پاس ایک سائیکل ہے۔", "میرا بھائی سائیکل پر کام پر جاتا ہے۔", "میرے بھائی کے پاس کبھی سائیکل نہیں تھی۔"),
           ("سارا دن بارش ہوتی رہی، اس لیے ہم گھر پر رہے۔", "ہم باہر نہیں گئے۔", "ہم نے گھر پر ایک فلم دیکھی۔", "سارا دن دھوپ رہی۔")],
}

# English training premises with (entailment, neutral, contradiction) hypotheses; some hold quote characters.
TRAIN_EN = [
    ("The library closes at six on weekdays.", "The library is open on weekdays.", "The library has a large collection of maps.", "The library is open all night on weekdays."),
    ("She baked bread for her neighbours this morning.", "She baked something today.", "Her neighbours like her bread very much.", "She did not cook anything today."),
    ("The train to the airport was forty minutes late.", "The train did not arrive on time.", "The train was full of tourists.", "The train to the airport arrived early."),
    ('The sign said "closed" when we arrived at the shop.', "The shop was not open when we arrived.", "The shop sells fresh vegetables.", "The shop was open when we got there."),
    ("Two children are playing football in the park.", "Some children are in the park.", "The children are brothers.", "The park is completely empty."),
    ("The company hired twenty new engineers this year.", "The company employed new staff this year.", "The engineers work on software.", "The company did not hire anyone this year."),
    ("He forgot his umbrella and got wet on the way home.", "He got wet.", "He lives far from his office.", "He stayed dry on the way home."),
    ('The concert was cancelled because the singer was "very ill".', "The concert did not take place.", "The tickets were expensive.", "The singer performed the whole concert."),
]
# Translations of the first two training premises, for translate-train-all.
TRAIN_MT = {
    "fr": [("La bibliothèque ferme à six heures en semaine.", "La bibliothèque est ouverte en semaine.", "La bibliothèque possède une grande collection de cartes.", "La bibliothèque est ouverte toute la nuit en semaine."),
           ("Elle a fait du pain pour ses voisins ce matin.", "Elle a cuisiné quelque chose aujourd'hui.", "Ses voisins aiment beaucoup son pain.", "Elle n'a rien cuisiné aujourd'hui.")],
    "de": [("Die Bibliothek schließt werktags um sechs Uhr.", "Die Bibliothek ist werktags geöffnet.", "Die Bibliothek hat eine große Kartensammlung.", "Die Bibliothek ist werktags die ganze Nacht geöffnet."),
           ("Sie hat heute Morgen Brot für ihre Nachbarn gebacken.", "Sie hat heute etwas gebacken.", "Ihre Nachbarn mögen ihr Brot sehr.", "Sie hat heute nichts gekocht.")],
}
GENRES = ("travel", "fiction", "government")


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def binary_parse(text: str) -> str:
    """A right-branching bracketing of the tokens (MultiNLI's field layout; not a parser's output)."""
    toks = tokens(text)
    out = toks[-1]
    for tok in reversed(toks[:-1]):
        out = f"( {tok} {out} )"
    return out


def flat_parse(text: str) -> str:
    return "(ROOT (S " + " ".join(f"(X {t})" for t in tokens(text)) + "))"


def pairs(premises: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str]]:
    return [(p, hyp, label) for p, *hyps in premises for hyp, label in zip(hyps, LABELS)]


def write_xnli(split: str, start: int, stop: int, first_pair: int) -> None:
    header = ("language gold_label sentence1_binary_parse sentence2_binary_parse sentence1_parse sentence2_parse "
              "sentence1 sentence2 promptID pairID genre label1 label2 label3 label4 label5 "
              "sentence1_tokenized sentence2_tokenized match").split()
    lines = ["\t".join(header)]
    for lang, premises in XNLI.items():
        for i, (p, h, label) in enumerate(pairs(premises[start:stop])):
            english = lang == "en"
            parses = [binary_parse(p), binary_parse(h), flat_parse(p), flat_parse(h)] if english else ["", "", "", ""]
            row = [lang, label, *parses, p, h, str(first_pair + i // 3), f"{first_pair + i // 3}{'enc'[i % 3]}",
                   GENRES[(first_pair + i // 3) % 3], label, label, label, label, label,
                   " ".join(tokens(p)), " ".join(tokens(h)), "True"]
            lines.append("\t".join(row))
    (HERE / "XNLI-1.0").mkdir(exist_ok=True)
    (HERE / "XNLI-1.0" / f"xnli.{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_mt(lang: str, premises: list[tuple[str, str, str, str]]) -> None:
    mt_label = {"contradiction": "contradictory"}
    lines = ["premise\thypo\tlabel"] + [f"{p}\t{h}\t{mt_label.get(y, y)}" for p, h, y in pairs(premises)]
    (HERE / "XNLI-MT-1.0" / "multinli").mkdir(parents=True, exist_ok=True)
    (HERE / "XNLI-MT-1.0" / "multinli" / f"multinli.train.{lang}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_multinli(name: str, premises: list[tuple[str, str, str, str]], first_pair: int, no_consensus: int) -> None:
    """MultiNLI 1.0 jsonl; record ``no_consensus`` gets gold_label '-' (annotators disagreed)."""
    lines = []
    for i, (p, h, label) in enumerate(pairs(premises)):
        gold = "-" if i == no_consensus else label
        annotators = [label, LABELS[(LABELS.index(label) + 1) % 3], LABELS[(LABELS.index(label) + 2) % 3]] if gold == "-" else [label] * 5
        record = {"annotator_labels": annotators, "genre": GENRES[(first_pair + i // 3) % 3], "gold_label": gold,
                  "pairID": f"{first_pair + i // 3}{'enc'[i % 3]}", "promptID": first_pair + i // 3,
                  "sentence1": p, "sentence1_binary_parse": binary_parse(p), "sentence1_parse": flat_parse(p),
                  "sentence2": h, "sentence2_binary_parse": binary_parse(h), "sentence2_parse": flat_parse(h)}
        lines.append(json.dumps(record, ensure_ascii=False))
    (HERE / "multinli_1.0").mkdir(exist_ok=True)
    (HERE / "multinli_1.0" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    write_xnli("dev", 0, 1, 100)
    write_xnli("test", 1, 3, 200)
    write_mt("en", TRAIN_EN)
    for lang, premises in TRAIN_MT.items():
        write_mt(lang, premises)
    write_multinli("multinli_1.0_train.jsonl", TRAIN_EN, 300, no_consensus=4)
    write_multinli("multinli_1.0_dev_matched.jsonl", XNLI["en"][:1], 400, no_consensus=1)


if __name__ == "__main__":
    main()
